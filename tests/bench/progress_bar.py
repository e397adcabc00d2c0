#!/usr/bin/python3
"""Times a worker that redraws a progress bar with '\\r' and never writes a newline, alone and
under `rdzv-agent --standalone`: wall seconds and peak RSS of each (the worker's alone, the
agent's and its worker's under rdzv). A benchmark: it prints figures and checks only that the
last redraw came through.

    tests/bench/progress_bar.py build/release/client/agent/rdzv-agent            # 8,000,000 redraws
    tests/bench/progress_bar.py build/release/client/agent/rdzv-agent 1000000 stdout

The worker writes to stderr, one write per redraw as tqdm does (default), or to stdout, which
Python buffers into large writes when it is not a terminal.
"""
import os
import resource
import subprocess
import sys
import tempfile
import time

WORKER = r'''
import sys
n = int(sys.argv[1])
w = getattr(sys, sys.argv[2]).write
for i in range(n):
    w("\r%d/%d" % (i + 1, n))
'''


def timed(argv, out):
    """Runs argv with stdout and stderr to `out`; returns (exit code, wall seconds, CPU seconds,
    peak RSS MiB) of the process and everything it waited for."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=out, stderr=out)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - start
    return (os.waitstatus_to_exitcode(status), seconds, usage.ru_utime + usage.ru_stime,
            usage.ru_maxrss / 1024)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    agent = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8_000_000
    stream = sys.argv[3] if len(sys.argv) > 3 else "stderr"
    if stream not in ("stderr", "stdout"):
        sys.exit("the stream is stderr or stdout")
    worker = [sys.executable, "-c", WORKER, str(n), stream]
    env_clean = {k: v for k, v in os.environ.items()
                 if not k.startswith(("SLURM_", "RDZV_", "TORCHELASTIC_"))}
    os.environ.clear()
    os.environ.update(env_clean)
    os.environ["RDZV_CONFIG"] = "/dev/null"
    print(f"{n} redraws of a progress bar on {stream}, no newline "
          f"(about {n * (len(str(n)) * 2 + 2) >> 20} MB)")
    print(f"{'case':<12} {'seconds':>8} {'cpu_s':>7} {'peak_rss_MiB':>13} {'output_MB':>10}")
    last = f"{n}/{n}"
    for name, argv in (("alone", worker),
                       ("rdzv-agent", [agent, "--standalone", "--", *worker])):
        with tempfile.TemporaryFile() as out:
            code, seconds, cpu, rss = timed(argv, out)
            size = out.seek(0, os.SEEK_END)
            out.seek(max(0, size - 200))
            tail = out.read().decode(errors="replace")
        ok = code == 0 and last in tail
        print(f"{name:<12} {seconds:8.2f} {cpu:7.2f} {rss:13.1f} {size / 1e6:10.1f}"
              + ("" if ok else f"  FAILED (exit {code}, last redraw missing)"))
        if not ok:
            sys.exit(1)


if __name__ == "__main__":
    main()
