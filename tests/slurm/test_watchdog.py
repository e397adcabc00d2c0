#!/usr/bin/env python3
"""The watchdog under a real Slurm (the local 3-node cluster of deploy/slurm/local-cluster.sh),
with 3-node PyTorch jobs (tests/watchdog_worker.py) whose rank 4 stops while the others wait in
all_reduce: inside torch's file timer, or after its heartbeats (--hang-timeout 5s, or auto).
srun must return soon after the deadline with SIGABRT's code, every agent must name that rank
and show the Python line it was stuck on, and nothing of the job may be left. With
--max-restarts 1 a rank that hangs only on the first attempt is restarted and the job succeeds.
Requests on the watchdog FIFO from a process outside the workers, and malformed ones, are
ignored and logged.

Inputs and conventions are those of test_slurm.py and test_failures.py, whose helpers this
suite reuses.
"""
import os
import re
import subprocess
import sys
import textwrap
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_failures  # noqa: E402
import test_slurm  # noqa: E402
from test_slurm import SOURCE_DIR, TORCH_PYTHON  # noqa: E402

WORKER = os.path.join(SOURCE_DIR, "tests", "watchdog_worker.py")

# A process that is none of the job's workers: it writes a malformed line and an expired timer
# of its own to the FIFO named by argv[1], and prints its pid.
FOREIGN_WRITER = textwrap.dedent("""\
    import json, os, sys
    fifo = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
    os.write(fifo, b"not a request at all\\n")
    expired = {"version": 1, "pid": os.getpid(), "scope_id": "foreign", "expiration_time": 1,
               "signal": 9}
    os.write(fifo, (json.dumps(expired) + "\\n").encode())
    print(os.getpid())
""")


def setUpModule():
    test_slurm.setUpModule()


class HangTest(test_failures.FailureCase):

    def run_hang(self, worker_args, agent_args=()):
        """A 3-node job of two workers per node whose rank 4 (n3's first) hangs; returns the
        output once srun is back, after checking its code and that every agent names rank 4."""
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"],
                               [TORCH_PYTHON, WORKER, "--hang-rank", "4", *worker_args],
                               env=self.env(),
                               agent_args=["--nproc-per-node", "2", *agent_args])
        code, out, err, _ = self.finish(proc, 240)
        output = out + err
        self.assertEqual(code, 134, output)
        causes = re.findall(r"job slurm-\d+\.0 failed: (.*)", output)
        self.assertEqual(len(causes), 3, output)
        for cause in causes:
            self.assertRegex(cause, r"^rank 4 hung: .*; stopped with SIGABRT "
                             r"\(local rank 0, node 2 on n3\)$")
        self.assertRegex(err, r'rank 4\'s stderr \(its stack\):\n    Fatal Python error: Aborted')
        self.assertGreaterEqual(len(re.findall(r'watchdog_worker\.py", line \d+ in stuck', err)),
                                4, output)
        self.assert_nothing_left(10)
        return output, causes

    def test_rank_stuck_in_timer_fails_every_node_with_its_stack(self):
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"],
                               [TORCH_PYTHON, WORKER, "--hang-rank", "4"],
                               env=self.env(), agent_args=["--nproc-per-node", "2"])
        code, out, err, seconds = self.finish(proc, 240)
        output = out + err
        self.assertEqual(code, 134, output)
        causes = re.findall(r"job slurm-\d+\.0 failed: (.*)", output)
        self.assertEqual(len(causes), 3, output)
        for cause in causes:
            self.assertRegex(cause, r'^rank 4 hung: timer "step" expired [0-9.]+s ago \(pid \d+\); '
                             r"stopped with SIGABRT \(local rank 0, node 2 on n3\)$")
        stacks = re.findall(r'watchdog_worker\.py", line \d+ in stuck', err)
        # Once forwarded from the worker itself, and once in each agent's root cause.
        self.assertGreaterEqual(len(stacks), 4, output)
        # From the hang's discovery to the last agent's root cause (the agents' log times):
        # the hung rank's stack (SIGKILL 3 s after SIGABRT at the latest) and every node stopping.
        def at(kind):
            return [int(h) * 3600 + int(m) * 60 + float(sec) for h, m, sec in re.findall(
                rf"rdzv-agent [A-Z] (\d\d):(\d\d):([0-9.]+) {kind}", output)]
        found, failed = at("rank 4 hung:"), at(r"job slurm-\S+ failed")
        self.assertTrue(found and failed, output)
        self.assertLess(max(failed) - min(found), 8, output)
        self.assert_nothing_left(10)

    def test_silent_heartbeat_fails_the_job(self):
        _, causes = self.run_hang(["--heartbeat"], ["--hang-timeout", "5s"])
        for cause in causes:
            self.assertRegex(cause, r"^rank 4 hung: no heartbeat for [0-9.]+s \(timeout 5s\);")

    def test_learned_heartbeat_timeout_finds_the_silent_rank(self):
        # Heartbeats 0.5 s apart: after the warm-up the learned timeout is the 3 s floor.
        output, causes = self.run_hang(
            ["--heartbeat", "--hang-step", "8", "--steps", "12"],
            ["--hang-timeout", "auto", "--hang-timeout-min", "3s"])
        for cause in causes:
            self.assertRegex(cause, r"^rank 4 hung: no heartbeat for [0-9.]+s "
                             r"\(timeout 3s, learned\);")
        self.assertNotIn("finished", output)

    def test_hang_is_restarted_and_the_second_attempt_succeeds(self):
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"],
                               [TORCH_PYTHON, WORKER, "--hang-rank", "4", "--first-attempt-only"],
                               env=self.env(),
                               agent_args=["--nproc-per-node", "2", "--max-restarts", "1"])
        code, out, err, _ = self.finish(proc, 240)
        output = out + err
        self.assertEqual(code, 0, output)
        restarts = re.findall(r"restarting the workers \(restart 1 of 1\) after: (.*)", output)
        self.assertEqual(len(restarts), 3, output)
        for reason in restarts:
            self.assertRegex(reason, r"^rank 4 hung: timer \"step\" expired")
        # Every rank finished on the second attempt (TORCHELASTIC_RESTART_COUNT=1), none on the
        # first.
        finished = sorted(re.findall(r"rank (\d+) finished 5 steps \(restart (\d+)\)", out))
        self.assertEqual(finished, [(str(r), "1") for r in range(6)], output)
        self.assert_nothing_left(10)

    def test_requests_from_other_processes_and_malformed_ones_are_ignored_and_logged(self):
        out_dir = self.out_dir()
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"],
                               [TORCH_PYTHON, WORKER, "--handshake", out_dir], env=self.env(),
                               agent_args=["--nproc-per-node", "2"])
        # Rank 4's FIFO is n3's agent's; the workers wait until the foreign process is done.
        named = os.path.join(out_dir, "fifo-4")
        self.wait_for(lambda: os.path.exists(named) or proc.poll() is not None, 180,
                      "rank 4 naming its timer file")
        if not os.path.exists(named):
            code, out, err, _ = self.finish(proc, 30)
            self.fail(f"srun ended ({code}) before rank 4 named its timer file\n{out}{err}")
        with open(named) as f:
            fifo = f.read()
        writer = subprocess.run([sys.executable, "-c", FOREIGN_WRITER, fifo], capture_output=True,
                                text=True, timeout=30)
        self.assertEqual(writer.returncode, 0, writer.stderr)
        foreign_pid = int(writer.stdout)
        # The agent reads the FIFO as it comes; give it a moment before the workers go on.
        time.sleep(0.5)
        open(os.path.join(out_dir, "go"), "w").close()
        code, out, err, _ = self.finish(proc, 240)
        output = out + err
        self.assertEqual(code, 0, output)
        self.assertEqual(len(re.findall(r"rank \d finished 5 steps", out)), 6, output)
        # Only n3's agent heard them, and said so, once for each kind and in its summary.
        self.assertEqual(err.count("watchdog FIFO: ignoring a malformed request"), 1, output)
        self.assertIn("ignoring a malformed request (", err)
        self.assertEqual(err.count(f"watchdog FIFO: ignoring a request from pid {foreign_pid}, "
                                   "which is not one of this agent's workers"), 1, output)
        self.assertEqual(err.count("watchdog FIFO: ignored 1 malformed requests and 1 from other "
                                   "processes"), 1, output)
        self.assertNotIn(" hung: ", output)
        self.assert_nothing_left(10)


if __name__ == "__main__":
    unittest.main()
