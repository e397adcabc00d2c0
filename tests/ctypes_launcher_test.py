#!/usr/bin/env python3
"""deploy/examples/ctypes_launcher.py, the Python launcher on librdzv.so's C interface, against
a real rdzvd on loopback: two launchers of 2 workers each get ranks 0-3 and torchrun's
environment; a failing worker makes its launcher exit with its code and the other launcher stop
its workers.

Inputs (ctest sets them): RDZVD_BIN, RDZV_AGENT_BIN (for tests/testing/rdzvd_process.py),
RDZV_LIBRARY (librdzv.so.0).
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "testing"))
from rdzvd_process import Rdzvd  # noqa: E402

LAUNCHER = os.path.join(os.path.dirname(HERE), "deploy", "examples", "ctypes_launcher.py")
PYTHON = "/usr/bin/python3"
VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


def processes_matching(marker):
    """Live processes (not zombies) whose command line contains `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open("/proc/%s/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z" and int(pid) != os.getpid():
            found.append("%s: %s" % (pid, cmdline))
    return found


class CtypesLauncherTest(unittest.TestCase):

    def setUp(self):
        library = os.environ.get("RDZV_LIBRARY", "")
        if not os.path.exists(library):
            self.fail("RDZV_LIBRARY=%r is not librdzv.so.0 (ctest sets it)" % library)
        self.dir = tempfile.mkdtemp(prefix="ctypes-launcher-test-")
        self.marker = "ctypeslaunchertest-%d-%d" % (os.getpid(), time.monotonic_ns())
        self.launchers = []

    def tearDown(self):
        # Launchers run in sessions of their own; their workers are in the same group.
        for p in self.launchers:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            p.log.close()
        deadline = time.monotonic() + 10
        while processes_matching(self.marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(processes_matching(self.marker), [], "processes left behind")

    def launch(self, endpoint, job, node, script, extra_env=None):
        """A launcher of node `node` (of 2) whose 2 workers run `script` (bash)."""
        log = tempfile.TemporaryFile(dir=self.dir)
        env = dict(os.environ, RDZV_CONFIG="/dev/null", **(extra_env or {}))
        p = subprocess.Popen(
            [PYTHON, LAUNCHER, "--rdzv-endpoint", endpoint, "--rdzv-id", job, "--nnodes", "2",
             "--node-rank", str(node), "--nproc", "2", "--auth", "none", "--join-timeout", "60",
             "--host-name", "n%d" % node, "--", "bash", "-c", script, self.marker],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
        p.log = log
        self.launchers.append(p)
        return p

    @staticmethod
    def output(p):
        # pread: the child shares this file's offset, and a seek would move its next write.
        fd = p.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")

    def wait(self, p, timeout=90):
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.fail("launcher did not exit within %d s:\n%s" % (timeout, self.output(p)))

    def write_env(self):
        """bash that writes the worker's torchrun variables to rank-$RANK.env."""
        return ("f=%s/rank-$RANK; env | grep -E '^(%s)=' > $f.tmp && mv $f.tmp $f.env"
                % (self.dir, "|".join(VARS)))

    def test_two_launchers_give_their_workers_ranks_0_to_3(self):
        with Rdzvd() as rdzvd:
            launchers = [self.launch(rdzvd.endpoint, "job", node, self.write_env())
                         for node in (0, 1)]
            for p in launchers:
                self.assertEqual(self.wait(p), 0, self.output(p))
        envs = {}
        for name in os.listdir(self.dir):
            if name.endswith(".env"):
                with open(os.path.join(self.dir, name)) as f:
                    env = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
                envs[int(env["RANK"])] = env
        self.assertEqual(sorted(envs), [0, 1, 2, 3])
        for rank, env in envs.items():
            self.assertEqual(env["WORLD_SIZE"], "4")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(env["LOCAL_RANK"], str(rank % 2))
            self.assertEqual(env["GROUP_RANK"], str(rank // 2))
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
        self.assertEqual(len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs.values()}), 1)
        self.assertTrue(envs[0]["MASTER_ADDR"])
        self.assertGreater(int(envs[0]["MASTER_PORT"]), 0)

    def test_a_failing_worker_fails_its_launcher_and_aborts_the_other(self):
        sleep = "exec -a %s-sleep sleep 120" % self.marker
        with Rdzvd() as rdzvd:
            failing = self.launch(rdzvd.endpoint, "failing", 0,
                                  'if [ "$RANK" = 1 ]; then sleep 1; exit 3; fi; ' + sleep)
            other = self.launch(rdzvd.endpoint, "failing", 1, sleep)
            self.assertEqual(self.wait(failing), 3, self.output(failing))
            self.assertIn("rank 1 exited with code 3", self.output(failing))
            # The other launcher hears the abort, stops its sleeping workers and fails too.
            self.assertEqual(self.wait(other, timeout=30), 3, self.output(other))
            text = self.output(other)
            self.assertIn("job failing aborted", text)
            self.assertIn("rank 1", text)

    def test_usage_errors_are_one_line(self):
        done = subprocess.run([PYTHON, LAUNCHER, "--rdzv-endpoint", "h:1", "--rdzv-id", "j",
                               "--nnodes", "x", "--nproc", "1", "--", "true"],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 2)
        errors = [line for line in done.stderr.splitlines() if not line.startswith("usage:")]
        self.assertEqual(len(errors), 1, done.stderr)
        self.assertIn("--nnodes 'x' is malformed", errors[0])

        done = subprocess.run([PYTHON, LAUNCHER, "--rdzv-endpoint", "h:1", "--rdzv-id", "j",
                               "--nnodes", "1", "--nproc", "1", "--", "true"],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, RDZV_LIBRARY="/nonexistent/librdzv.so.0"))
        self.assertEqual(done.returncode, 1)
        self.assertEqual(len(done.stderr.splitlines()), 1, done.stderr)
        self.assertIn("cannot load /nonexistent/librdzv.so.0", done.stderr)


if __name__ == "__main__":
    unittest.main()
