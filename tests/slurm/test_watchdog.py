#!/usr/bin/env python3
"""The watchdog under a real Slurm (the local 3-node cluster of deploy/slurm/local-cluster.sh):
one rank of a 3-node PyTorch job sleeps inside torch's file timer while the others wait in
all_reduce. srun must return soon after the deadline with SIGABRT's code, every agent must name
that rank and show the Python line it was stuck on, and nothing of the job may be left.

Inputs and conventions are those of test_slurm.py and test_failures.py, whose helpers this
suite reuses.
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_failures  # noqa: E402
import test_slurm  # noqa: E402
from test_slurm import SOURCE_DIR, TORCH_PYTHON  # noqa: E402

WORKER = os.path.join(SOURCE_DIR, "tests", "watchdog_worker.py")


def setUpModule():
    test_slurm.setUpModule()


class HangTest(test_failures.FailureCase):

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


if __name__ == "__main__":
    unittest.main()
