#!/usr/bin/python3
"""Runs rdzv-agent and Debian's torchrun (torch 1.13) on the same launches and prints medians.

Cases, all on loopback:
  standalone   one agent, one worker running `true`
  N agents     N agents (--nodes, default 8 and 32) against one rendezvous endpoint, each
               running one `true` worker: wall time until every agent has exited
  fail-fast    2 agents x 2 workers; rank 1 exits 1 after 2 s, the others sleep 100 s: wall
               time until every agent and worker is gone (also counted from the failure)

Usage: /usr/bin/python3 tests/bench/compare_torchrun.py --build-dir build/release [--reps 3]
       [--failfast-reps 1] [--nodes 8,32] [--csv FILE] [--cases standalone,agents,failfast]

Debian's torchrun 1.13 crashes under Python 3.11 in Std.from_str (iterating an IntFlag skips
NONE), so torchrun runs as `python3 -c` with that one lookup replaced at run time; nothing on
the system is edited. Everything started here runs in a session of its own and is killed on the
way out, and every wait has a timeout.
"""

import argparse
import csv
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

# torchrun with Std.from_str fixed for Python 3.11; the rest of the command line follows.
TORCHRUN_PATCHED = r"""
import re, sys
from torch.distributed.elastic.multiprocessing import api

def _from_str(cls, vm):
    if re.fullmatch(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.fullmatch(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")

api.Std.from_str = classmethod(_from_str)
from torch.distributed.run import main
sys.argv[0] = "torchrun"
main()
"""

_started = []  # every Popen, so that nothing outlives the script


def start(argv, log):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    _started.append(p)
    return p


def kill_all():
    for p in _started:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def processes_with(marker):
    """Pids of our processes whose command line contains `marker`."""
    pids = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(d))
        except OSError:
            pass
    return pids


def kill_marked(marker):
    for pid in processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_all(procs, timeout):
    """Waits for every process; their exit codes (None for one killed at the timeout)."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            codes.append(None)
    return codes


class Tools:
    def __init__(self, args, logdir):
        self.agent = os.path.join(args.build_dir, "client", "rdzv-agent")
        self.rdzvd = os.path.join(args.build_dir, "server", "rdzvd")
        self.python = args.python
        self.logdir = logdir
        self.rdzvd_port = None

    def log(self, name):
        return open(os.path.join(self.logdir, name), "ab")

    def start_rdzvd(self):
        for _ in range(5):
            port = free_port()
            p = start([self.rdzvd, "--listen", f"127.0.0.1:{port}", "--log-level", "warn"],
                      self.log("rdzvd.log"))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and p.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    self.rdzvd_port = port
                    return
                except OSError:
                    time.sleep(0.01)
        sys.exit("compare_torchrun: rdzvd did not start; see " + self.logdir)

    def torchrun(self, *args):
        return [self.python, "-c", TORCHRUN_PATCHED] + list(args)

    # Commands for one agent of each tool.
    def standalone(self, tool, worker):
        if tool == "rdzv":
            return [self.agent, "--standalone", "--nproc-per-node", "1", "--"] + worker
        return self.torchrun("--standalone", "--nproc_per_node", "1", "--no_python", *worker)

    def member(self, tool, job, port, nnodes, nproc, worker):
        if tool == "rdzv":
            return [self.agent, "--rdzv-endpoint", f"127.0.0.1:{self.rdzvd_port}", "--rdzv-id",
                    job, "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--"] + worker
        return self.torchrun("--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                             "--rdzv_id", job, "--nnodes", str(nnodes), "--nproc_per_node",
                             str(nproc), "--no_python", *worker)


def run_standalone(tools, tool):
    t0 = time.monotonic()
    p = start(tools.standalone(tool, ["true"]), tools.log(f"{tool}-standalone.log"))
    code = wait_all([p], 120)[0]
    return time.monotonic() - t0, code == 0


def run_agents(tools, tool, n, rep):
    job = f"cmp-{tool}-{n}-{rep}-{os.getpid()}"
    port = free_port()
    log = tools.log(f"{tool}-agents-{n}.log")
    t0 = time.monotonic()
    procs = [start(tools.member(tool, job, port, n, 1, ["true"]), log) for _ in range(n)]
    codes = wait_all(procs, 300)
    return time.monotonic() - t0, all(c == 0 for c in codes)


def run_failfast(tools, tool, rep, sleep_s):
    # A fractional sleep unique to this run names its workers in the process table.
    marker = f"{sleep_s}.{random.randrange(10**6, 10**7)}"
    stamp = os.path.join(tools.logdir, f"{tool}-failed-{rep}")
    script = (f'if [ "$RANK" = 1 ]; then sleep 2; date +%s.%N > {stamp}; exit 1; fi; '
              f"exec sleep {marker}")
    job = f"cmp-ff-{tool}-{rep}-{os.getpid()}"
    port = free_port()
    log = tools.log(f"{tool}-failfast.log")
    t0_wall, t0 = time.time(), time.monotonic()
    procs = [start(tools.member(tool, job, port, 2, 2, ["sh", "-c", script]), log)
             for _ in range(2)]
    limit = sleep_s + 60
    codes = wait_all(procs, limit)
    # The agents are gone; their workers must be too.
    deadline = time.monotonic() + max(1.0, limit - (time.monotonic() - t0))
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    gone = time.monotonic() - t0
    left = processes_with(marker)
    kill_marked(marker)
    try:
        with open(stamp) as f:
            after = t0 + (float(f.read()) - t0_wall)
        since_failure = gone - (after - t0)
    except (OSError, ValueError):
        since_failure = float("nan")
    ok = not left and None not in codes
    return gone, since_failure, ok


def median(v):
    return statistics.median(v) if v else float("nan")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.path.join(here, "..", "..", "build", "release"),
                    help="where rdzv-agent and rdzvd were built (default build/release)")
    ap.add_argument("--python", default="/usr/bin/python3", help="the Python that has torch")
    ap.add_argument("--reps", type=int, default=3, help="runs per case (default 3)")
    ap.add_argument("--failfast-reps", type=int, default=1,
                    help="runs of the fail-fast case (default 1: torchrun's takes ~100 s)")
    ap.add_argument("--nodes", default="8,32", help="agent counts (default 8,32)")
    ap.add_argument("--sleep", type=int, default=100, help="the healthy workers' sleep, seconds")
    ap.add_argument("--cases", default="standalone,agents,failfast")
    ap.add_argument("--tools", default="rdzv,torchrun")
    ap.add_argument("--csv", help="also write one row per run to this file")
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    tool_list = args.tools.split(",")
    nodes = [int(n) for n in args.nodes.split(",") if n]

    logdir = tempfile.mkdtemp(prefix="rdzv-compare.")
    tools = Tools(args, logdir)
    if not os.access(tools.agent, os.X_OK):
        sys.exit(f"compare_torchrun: no rdzv-agent at {tools.agent}; pass --build-dir")
    rows = []  # (tool, case, agents, rep, seconds, ok)
    ok_all = True

    def record(tool, case, n, rep, seconds, ok):
        nonlocal ok_all
        rows.append((tool, case, n, rep, seconds, ok))
        ok_all = ok_all and ok
        print(f"  {tool:9s} {case:26s} rep {rep}: {seconds:8.3f} s{'' if ok else '  FAILED'}",
              flush=True)

    try:
        if "rdzv" in tool_list and cases & {"agents", "failfast"}:
            tools.start_rdzvd()
        if "standalone" in cases:
            for tool in tool_list:
                for rep in range(args.reps):
                    record(tool, "standalone true", 1, rep, *run_standalone(tools, tool))
        if "agents" in cases:
            for n in nodes:
                for tool in tool_list:
                    for rep in range(args.reps):
                        record(tool, f"{n} agents true", n, rep, *run_agents(tools, tool, n, rep))
        if "failfast" in cases:
            for tool in tool_list:
                for rep in range(args.failfast_reps):
                    gone, since, ok = run_failfast(tools, tool, rep, args.sleep)
                    record(tool, "fail-fast: all gone", 2, rep, gone, ok)
                    record(tool, "fail-fast: after failure", 2, rep, since, ok)
    finally:
        kill_all()

    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["tool", "case", "agents", "rep", "wall_s", "ok"])
            for r in rows:
                w.writerow([r[0], r[1], r[2], r[3], f"{r[4]:.4f}", int(r[5])])

    print()
    print(f"{'case':28s} {'rdzv_s':>9s} {'torchrun_s':>11s} {'torchrun/rdzv':>14s}")
    seen = []
    for r in rows:
        if r[1] not in seen:
            seen.append(r[1])
    for case in seen:
        med = {t: median([r[4] for r in rows if r[0] == t and r[1] == case]) for t in tool_list}
        rd, tr = med.get("rdzv", float("nan")), med.get("torchrun", float("nan"))
        ratio = tr / rd if rd and rd == rd and tr == tr else float("nan")
        print(f"{case:28s} {rd:9.3f} {tr:11.3f} {ratio:13.1f}x")
    if not ok_all:
        print(f"compare_torchrun: some runs failed; logs in {logdir}", file=sys.stderr)
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
