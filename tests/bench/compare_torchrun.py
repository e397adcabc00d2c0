#!/usr/bin/python3
"""Runs rdzv-agent and Debian's torchrun (torch 1.13) on the same launches and prints medians.

Cases, all on loopback:
  standalone   one agent, one worker running `true`
  N agents     N agents (--nodes, default 8 and 32) against one rendezvous endpoint, each
               running one `true` worker: wall time until every agent has exited
  fail-fast    2 agents x 2 workers; rank 1 exits 1 after 2 s, the others sleep 100 s: wall
               time until every agent and worker is gone (also counted from the failure)
  finished     2 agents x 1 worker, --max-restarts 1: rank 0 exits 0 at once, rank 1 exits 3
               two seconds later, so that the restart would need the node that finished: time
               from the failure until both agents are gone (--finished-limit, 90 s, at most;
               torchrun's join timeout is set 10 s below it), and their exit codes

A case that needs a Slurm cluster with 3 usable nodes (deploy/slurm/local-cluster.sh start),
not in the default --cases:
  srun-failfast  srun -N3 --ntasks-per-node=1, 2 workers per node: global rank 4 exits 3 after
               1 s, the others sleep --srun-sleep (60) s. Time from the failure (rank 4 writes a
               timestamp just before it exits) until srun, every agent and every worker is gone,
               and srun's exit code. rdzv: `srun ... rdzv-agent --nproc-per-node 2` (node 0
               hosts the rendezvous); torchrun: c10d on a loopback port, once under plain srun
               (the survivors run on until their sleep ends) and once under
               `srun --kill-on-bad-exit=1` (the usual glue), each a row of its own against the
               same rdzv runs. Runs --reps times for rdzv and --failfast-reps times for torchrun.
               Slurm's environment is the one this runs in when SLURM_CONF is set, otherwise
               what `deploy/slurm/local-cluster.sh env` prints; with no cluster up the case is
               skipped with one line saying how to start it.

  srun-hang    the same shape, but global rank 4 hangs: it sleeps inside torch's file timer
               (`timer.expires(after=2)`) and never returns, the others sleep --srun-sleep s.
               Time from the timer's deadline until srun, every agent and every worker is gone.
               rdzv serves the timer FIFO by default; torchrun runs with
               TORCHELASTIC_ENABLE_FILE_TIMER=1 (its FileTimerServer), under plain srun and
               under --kill-on-bad-exit=1, like srun-failfast.

  srun-spare   srun -N4 --ntasks-per-node=1, 2 workers per node, one spare node's worth: rdzv
               with --spare-nodes 1 --max-restarts 1 (n1-n3 run, n4 waits), torchrun with
               --nnodes 3:4 --max-restarts 1 (c10d hosted by node 0's agent, which torchrun's
               is_host option pins). The workers are real torch processes: gloo
               init_process_group, then all_reduce every 50 ms. Node 1's agent (n2) is killed
               with SIGKILL ("agent" rows), or the agent and its workers at once ("node" rows:
               the node dies). Measured from the kill: until every worker of the healed job has
               started (its first line, before torch loads: the control plane and the spawn),
               and until every one has formed its process group (rdzv also: until its last
               agent logged its new place, rdzv's own part); also whether the surviving
               nodes kept their ranks. A job that has not healed --spare-limit (60) s after the
               kill is a row that says so.

Usage: /usr/bin/python3 tests/bench/compare_torchrun.py --build-dir build/release [--reps 3]
       [--failfast-reps 1] [--nodes 8,32] [--csv FILE]
       [--cases standalone,agents,failfast,finished,srun-failfast,srun-hang,srun-spare]
       [--srun-sleep 60] [--finished-limit 90]

Debian's torchrun 1.13 crashes under Python 3.11 in Std.from_str (iterating an IntFlag skips
NONE), so torchrun runs as `python3 -c` with that one lookup replaced at run time; nothing on
the system is edited. Everything started here runs in a session of its own and is killed on the
way out (Slurm jobs are cancelled with scancel, stray workers found by their command line are
killed), and every wait has a timeout.
"""

import argparse
import csv
import os
import random
import re
import shlex
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
_slurm_jobs = []  # (job name, environment) of every srun, cancelled on the way out
_markers = []  # command-line markers of every worker started under srun


def start(argv, log, env=None):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True, env=env)
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


def scancel(name, env):
    try:
        subprocess.run(["scancel", "--name", name], env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass


def cleanup():
    for name, env in _slurm_jobs:
        scancel(name, env)
    kill_all()
    for marker in _markers:
        kill_marked(marker)


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
        self.agent = os.path.join(args.build_dir, "client", "agent", "rdzv-agent")
        self.rdzvd = os.path.join(args.build_dir, "server", "rdzvd")
        self.python = args.python
        self.logdir = logdir
        self.rdzvd_port = None

    def log(self, name):
        return open(os.path.join(self.logdir, name), "ab")

    def start_rdzvd(self):
        for _ in range(5):
            port = free_port()
            p = start([self.rdzvd, "--auth", "none", "--listen", f"127.0.0.1:{port}",
                       "--log-level", "warn"],
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

    def member(self, tool, job, port, nnodes, nproc, worker, rdzv_args=(), torchrun_args=()):
        if tool == "rdzv":
            return [self.agent, "--rdzv-endpoint", f"127.0.0.1:{self.rdzvd_port}", "--rdzv-id",
                    job, "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), *rdzv_args,
                    "--"] + worker
        return self.torchrun("--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                             "--rdzv_id", job, "--nnodes", str(nnodes), "--nproc_per_node",
                             str(nproc), *torchrun_args, "--no_python", *worker)


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


def run_finished(tools, tool, rep, limit):
    """2 agents x 1 worker, --max-restarts 1: rank 0 exits 0 at once (its agent is done), rank 1
    exits 3 two seconds later. Seconds from rank 1's failure until both agents are gone (at most
    `limit`: torchrun's restart waits for node 0 at its rendezvous until its join timeout, which
    is set to `limit` - 10 s), and the agents' exit codes (None for one killed at the limit)."""
    stamp = os.path.join(tools.logdir, f"{tool}-finished-failed-{rep}")
    script = f'[ "$RANK" = 0 ] && exit 0; sleep 2; date +%s.%N > {stamp}; exit 3'
    job = f"cmp-fin-{tool}-{rep}-{os.getpid()}"
    port = free_port()
    log = tools.log(f"{tool}-finished.log")
    t0_wall, t0 = time.time(), time.monotonic()
    procs = [start(tools.member(tool, job, port, 2, 1, ["sh", "-c", script],
                                rdzv_args=("--max-restarts", "1"),
                                torchrun_args=("--max_restarts", "1", "--rdzv_conf",
                                               f"join_timeout={max(1, limit - 10)}")), log)
             for _ in range(2)]
    codes = wait_all(procs, limit)
    gone = time.monotonic()
    try:
        with open(stamp) as f:
            failed = t0 + (float(f.read()) - t0_wall)
        since_failure = gone - failed
    except (OSError, ValueError):
        since_failure = float("nan")
    return since_failure, codes


def slurm_env(repo):
    """The environment for srun, or None after one line saying why the srun case is skipped.

    SLURM_CONF comes from this environment or else from `local-cluster.sh env`; every other
    SLURM_* variable is dropped, so that srun always makes an allocation of its own (never a
    step of one this runs in, which scancel --name could then cancel)."""
    script = os.path.join(repo, "deploy", "slurm", "local-cluster.sh")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    if "SLURM_CONF" not in env and os.access(script, os.X_OK):
        try:
            out = subprocess.run([script, "env"], stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        for line in out.splitlines():
            words = shlex.split(line)
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                key, value = words[1].split("=", 1)
                env[key] = value
    usable = set()
    if shutil.which("srun") and shutil.which("sinfo"):
        try:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env,
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=30)
            for line in out.stdout.splitlines() if out.returncode == 0 else []:
                words = line.split()
                if len(words) == 2 and words[1] in ("idle", "mixed", "allocated"):
                    usable.add(words[0])
        except (OSError, subprocess.TimeoutExpired):
            pass
    if len(usable) < 3:
        print(f"compare_torchrun: skipping srun-failfast: no Slurm cluster with 3 usable nodes "
              f"(SLURM_CONF={env.get('SLURM_CONF', 'unset')}); start one with "
              f"`{os.path.relpath(script)} start`", flush=True)
        return None
    return env


# The srun-hang worker: rank 4 sleeps inside torch's file timer and writes the timer's deadline
# first; the others sleep. argv: STAMP SLEEP_S (the sleep, with its fraction, marks the run).
HANG_WORKER = r"""
import os, sys, time
from torch.distributed.elastic import timer
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
if os.environ["RANK"] == "4":
    time.sleep(1)
    deadline = time.time() + 2
    with open(sys.argv[1], "w") as f:
        f.write(repr(deadline))
    with timer.expires(after=2, scope="step"):
        time.sleep(600)
time.sleep(float(sys.argv[2]))
"""


def run_srun_failfast(tools, tool, rep, sleep_s, env, kill_on_bad_exit=False, hang=False):
    """3 nodes x 2 workers under srun, rank 4 fails (or, with `hang`, hangs in a file timer):
    seconds from the failure (the timer's deadline) until srun and everything it started is
    gone, seconds until srun returned, srun's exit code, how many marked processes were still
    alive when srun returned, and whether the run was clean."""
    # The fractional sleep names this run's workers in the process table; it is in the command
    # line of srun, of every agent or torchrun (after `--`) and of every worker.
    marker = f"{sleep_s}.{random.randrange(10**6, 10**7)}"
    variant = ("hang-" if hang else "") + tool + ("-kill-on-bad-exit" if kill_on_bad_exit else "")
    stamp = os.path.join(tools.logdir, f"srun-{variant}-failed-{rep}")
    script = (f'if [ "$RANK" = 4 ]; then sleep 1; date +%s.%N > {stamp}; exit 3; fi; '
              f"exec sleep {marker}")
    name = f"cmp-sff-{variant}-{rep}-{os.getpid()}-{random.randrange(10**6)}"
    srun = ["srun", "--job-name", name, "-N3", "--ntasks-per-node=1"]
    if kill_on_bad_exit:
        srun.append("--kill-on-bad-exit=1")
    worker = ["sh", "-c", script]
    if hang:
        worker = [tools.python, "-c", HANG_WORKER, stamp, marker]
        if tool == "torchrun":
            env = dict(env, TORCHELASTIC_ENABLE_FILE_TIMER="1")
    if tool == "rdzv":
        argv = srun + [tools.agent, "--nproc-per-node", "2", "--"] + worker
    else:
        argv = srun + tools.torchrun("--nnodes", "3", "--nproc_per_node", "2", "--rdzv_backend",
                                     "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
                                     "--rdzv_id", name, "--no_python", *worker)
    _slurm_jobs.append((name, env))
    _markers.append(marker)
    limit = sleep_s + 60
    t0_wall, t0 = time.time(), time.monotonic()
    p = start(argv, tools.log(f"srun-{variant}.log"), env)
    try:
        code = p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        scancel(name, env)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        code = None
    returned = time.monotonic()
    at_return = len(processes_with(marker))
    # srun is gone; every agent and worker must be too (on their nodes, not below srun).
    deadline = returned + max(5.0, limit - (returned - t0))
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    gone = time.monotonic()
    left = processes_with(marker)
    if left:
        scancel(name, env)
        kill_marked(marker)
    else:
        _slurm_jobs.remove((name, env))
        _markers.remove(marker)
    try:
        with open(stamp) as f:
            failed = t0 + (float(f.read()) - t0_wall)
        since_failure, srun_after = gone - failed, returned - failed
    except (OSError, ValueError):
        since_failure = srun_after = float("nan")
    ok = code is not None and not left and since_failure == since_failure
    return since_failure, srun_after, code, at_return, ok


# The srun-spare worker. argv: STAMPS MARKER. Writes STAMPS/run<restart>-<rank> once its process
# group has formed: when it started, when the group formed, its node, node rank and world size.
# In the first run it then all-reduces every 50 ms until stopped; in a restart it is done.
SPARE_WORKER = r"""
import os, sys, time
started = time.time()
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
formed = time.time()
env = os.environ
run = env["TORCHELASTIC_RESTART_COUNT"]
path = os.path.join(sys.argv[1], "run%s-%s" % (run, env["RANK"]))
with open(path + ".tmp", "w") as f:
    f.write("%r %r %s %s %s" % (started, formed, env.get("SLURMD_NODENAME", "?"),
                                env["GROUP_RANK"], env["WORLD_SIZE"]))
os.rename(path + ".tmp", path)
if run == "0":
    t = torch.zeros(1)
    while True:
        dist.all_reduce(t)
        time.sleep(0.05)
"""


def read_runs(stamps, run):
    """rank -> (started, formed, node, node rank, world size) of the workers of `run`."""
    out = {}
    for name in os.listdir(stamps):
        if name.startswith(f"run{run}-") and not name.endswith(".tmp"):
            try:
                with open(os.path.join(stamps, name)) as f:
                    a, b, node, group, world = f.read().split()
                out[int(name.split("-")[1])] = (float(a), float(b), node, int(group), int(world))
            except (OSError, ValueError):
                pass
    return out


def task_on(marker, node):
    """The pid of the srun task (the agent, or torchrun) on `node`, and every process of the
    run there."""
    mine = {}
    for pid in processes_with(marker):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"SLURMD_NODENAME={node}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                mine[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tops = [pid for pid, parent in mine.items() if parent not in mine]
    return (tops[0] if len(tops) == 1 else None), list(mine)


def run_srun_spare(tools, tool, rep, env, whole_node, limit_s):
    """One srun-spare run: (seconds to every healed worker started, to every one formed, to
    every agent of the healed job assigned (rdzv: from their logs), whether the surviving nodes
    kept their ranks, a note, ok)."""
    marker = f"spare{random.randrange(10**6, 10**7)}"
    variant = f"{tool}-{'node' if whole_node else 'agent'}-{rep}"
    stamps = os.path.join(tools.logdir, f"spare-{variant}")
    os.makedirs(stamps)
    name = f"cmp-spare-{variant}-{os.getpid()}"
    srun = ["srun", "--job-name", name, "-N4", "--ntasks-per-node=1"]
    worker = [tools.python, "-c", SPARE_WORKER, stamps, marker]
    if tool == "rdzv":
        argv = srun + [tools.agent, "--nproc-per-node", "2", "--spare-nodes", "1",
                       "--max-restarts", "1", "--"] + worker
    else:
        # Node 0's torchrun hosts the c10d store (all nodes are 127.0.0.1 here).
        run = shlex.join(tools.torchrun(
            "--nnodes", "3:4", "--nproc_per_node", "2", "--max_restarts", "1",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
            "--rdzv_id", name, "--rdzv_conf", "is_host=IS_HOST", "--no_python", *worker))
        run = run.replace("is_host=IS_HOST", 'is_host=$([ "$SLURM_NODEID" = 0 ] && echo 1 || '
                                              'echo 0)')
        argv = srun + ["sh", "-c", "exec " + run, marker]
    _slurm_jobs.append((name, env))
    _markers.append(marker)
    p = start(argv, tools.log(f"srun-spare-{variant}.log"), env)
    note = ""
    assigned = float("nan")
    try:
        deadline = time.monotonic() + 120
        first = {}
        while time.monotonic() < deadline and p.poll() is None:
            first = read_runs(stamps, 0)
            if len(first) == (6 if tool == "rdzv" else 8):
                break
            time.sleep(0.05)
        agent, node_pids = task_on(marker, "n2")
        if agent is None or not first:
            return float("nan"), float("nan"), assigned, False, "the job did not start", False
        killed = time.time()
        for pid in (node_pids if whole_node else [agent]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        healed = {}
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            healed = read_runs(stamps, 1)
            if len(healed) == 6:
                break
            time.sleep(0.02)
        if len(healed) < 6:
            left = len(processes_with(marker))
            return (float("nan"), float("nan"), assigned, False,
                    f"not healed {limit_s} s after the kill ({len(healed)} of 6 workers "
                    f"restarted; {left} processes of the run alive)", True)
        started = max(h[0] for h in healed.values()) - killed
        formed = max(h[1] for h in healed.values()) - killed
        # The nodes other than n2 (and the one that replaced it): same node rank, same ranks.
        before = {r: (w[2], w[3]) for r, w in first.items() if w[2] != "n2"}
        after = {r: (w[2], w[3]) for r, w in healed.items()}
        kept = all(after.get(r) == v for r, v in before.items() if v[0] in
                   {w[2] for w in healed.values()})
        try:
            code = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        note = f"srun exit {code}; world {healed[0][4]}"
        if tool == "rdzv":
            # rdzv's own part: until the last agent of the healed job logged its place (the
            # agents log local wall time to the millisecond).
            with open(os.path.join(tools.logdir, f"srun-spare-{variant}.log"), "rb") as f:
                log = f.read().decode(errors="replace")
            stamps_s = [int(h) * 3600 + int(m) * 60 + float(sec) for h, m, sec in re.findall(
                r"rdzv-agent I (\d\d):(\d\d):(\d\d\.\d+) job \S+ round 2: node \d+ of", log)]
            t = time.localtime(killed)
            kill_s = t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec + (killed % 1)
            if len(stamps_s) == 3:
                assigned = max(stamps_s) - kill_s
        return started, formed, assigned, kept, note, True
    finally:
        scancel(name, env)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        kill_marked(marker)


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
    ap.add_argument("--srun-sleep", type=int, default=60,
                    help="the healthy workers' sleep in srun-failfast, seconds (default 60)")
    ap.add_argument("--finished-limit", type=int, default=90,
                    help="finished: how long the agents may take after the failure (default 90)")
    ap.add_argument("--cases", default="standalone,agents,failfast",
                    help="comma-separated; also srun-failfast and srun-hang, which need a Slurm "
                    "cluster "
                    "(default standalone,agents,failfast)")
    ap.add_argument("--spare-limit", type=int, default=60,
                    help="srun-spare: how long after the kill a job may take to heal (default 60)")
    ap.add_argument("--tools", default="rdzv,torchrun")
    ap.add_argument("--csv", help="also write one row per run to this file")
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    unknown = cases - {"standalone", "agents", "failfast", "finished", "srun-failfast",
                       "srun-hang", "srun-spare"}
    if unknown:
        ap.error(f"unknown --cases {','.join(sorted(unknown))}")
    # SIGTERM unwinds like Ctrl-C, so that everything started is still killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tool_list = args.tools.split(",")
    nodes = [int(n) for n in args.nodes.split(",") if n]

    logdir = tempfile.mkdtemp(prefix="rdzv-compare.")
    tools = Tools(args, logdir)
    if not os.access(tools.agent, os.X_OK):
        sys.exit(f"compare_torchrun: no rdzv-agent at {tools.agent}; pass --build-dir")
    rows = []  # (tool, case, agents, rep, seconds, ok, exit code or None)
    ok_all = True
    srun_case = "srun-failfast: after failure"
    srun_kob_case = "srun-failfast kill-on-bad-exit"
    hang_case = "srun-hang: after the deadline"
    hang_kob_case = "srun-hang kill-on-bad-exit"
    # rdzv runs under plain srun in both rows
    rdzv_case_for = {srun_kob_case: srun_case, hang_kob_case: hang_case}
    srun_notes = []  # (label, rep, exit code, seconds until srun returned, alive at return)

    def record(tool, case, n, rep, seconds, ok, code=None):
        nonlocal ok_all
        rows.append((tool, case, n, rep, seconds, ok, code))
        ok_all = ok_all and ok
        print(f"  {tool:9s} {case:32s} rep {rep}: {seconds:8.3f} s{'' if ok else '  FAILED'}",
              flush=True)

    try:
        if "rdzv" in tool_list and cases & {"agents", "failfast", "finished"}:
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
        if "finished" in cases:
            for tool in tool_list:
                for rep in range(args.reps if tool == "rdzv" else args.failfast_reps):
                    since, codes = run_finished(tools, tool, rep, args.finished_limit)
                    # rdzv: node 0 succeeded, node 1 ends with the rank's code at once.
                    ok = sorted(codes) == [0, 3] if tool == "rdzv" else since == since
                    failed = [c for c in codes if c != 0]
                    record(tool, "finished: after failure", 2, rep, since, ok,
                           failed[0] if failed else 0)
                    print(f"  {'':9s} exit codes {codes}", flush=True)
        srun_env = None
        if cases & {"srun-failfast", "srun-hang", "srun-spare"}:
            srun_env = slurm_env(os.path.normpath(os.path.join(here, "..", "..")))
        if srun_env is not None:
            variants = [(h, t, kob) for h in (False, True)
                        if ("srun-hang" if h else "srun-failfast") in cases
                        for t in tool_list for kob in ([False, True] if t == "torchrun"
                                                       else [False])]
            for hang, tool, kob in variants:
                label = ("hang " if hang else "") + tool + (" --kill-on-bad-exit=1" if kob else "")
                case = ((hang_kob_case if kob else hang_case) if hang
                        else (srun_kob_case if kob else srun_case))
                for rep in range(args.reps if tool == "rdzv" else args.failfast_reps):
                    since, srun_after, code, alive, ok = run_srun_failfast(
                        tools, tool, rep, args.srun_sleep, srun_env, kob, hang)
                    record(tool, case, 3, rep, since, ok, code)
                    print(f"  {'':9s} srun exit {code}, returned {srun_after:.3f} s after the "
                          f"failure; {alive} processes of the run alive then", flush=True)
                    srun_notes.append((label, rep, code, srun_after, alive))
        if srun_env is not None and "srun-spare" in cases:
            for whole_node in (False, True):
                what = "node" if whole_node else "agent"
                for tool in tool_list:
                    for rep in range(args.reps if tool == "rdzv" else args.failfast_reps):
                        started, formed, assigned, kept, note, ok = run_srun_spare(
                            tools, tool, rep, srun_env, whole_node, args.spare_limit)
                        if tool == "rdzv":
                            record(tool, f"spare: {what} kill to assigned", 4, rep, assigned, ok)
                        record(tool, f"spare: {what} kill to started", 4, rep, started, ok)
                        record(tool, f"spare: {what} kill to formed", 4, rep, formed, ok)
                        print(f"  {'':9s} survivors kept their ranks: {'yes' if kept else 'no'}"
                              f"; {note}", flush=True)
    finally:
        cleanup()

    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["tool", "case", "agents", "rep", "wall_s", "ok", "exit_code"])
            for r in rows:
                w.writerow([r[0], r[1], r[2], r[3], f"{r[4]:.4f}", int(r[5]),
                            "" if r[6] is None else r[6]])

    print()
    print(f"{'case':34s} {'rdzv_s':>9s} {'torchrun_s':>11s} {'torchrun/rdzv':>14s}")
    seen = []
    for r in rows:
        if r[1] not in seen:
            seen.append(r[1])
    for case in seen:
        med = {t: median([r[4] for r in rows
                          if r[0] == t and r[1] == (rdzv_case_for.get(case, case)
                                                    if t == "rdzv" else case)])
               for t in tool_list}
        rd, tr = med.get("rdzv", float("nan")), med.get("torchrun", float("nan"))
        ratio = tr / rd if rd and rd == rd and tr == tr else float("nan")
        print(f"{case:34s} {rd:9.3f} {tr:11.3f} {ratio:13.1f}x")
    if srun_notes:
        print(f"\n... kill-on-bad-exit rows: torchrun under srun --kill-on-bad-exit=1, against "
              f"the rdzv runs under plain srun")
        for label in dict.fromkeys(n[0] for n in srun_notes):
            mine = [n for n in srun_notes if n[0] == label]
            print(f"srun {label}: srun exit codes "
                  f"{','.join(str(n[2]) for n in mine)}; srun returned "
                  f"{median([n[3] for n in mine]):.3f} s after the failure (median); "
                  f"processes of the run alive then: {','.join(str(n[4]) for n in mine)}")
    if not ok_all:
        print(f"compare_torchrun: some runs failed; logs in {logdir}", file=sys.stderr)
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
