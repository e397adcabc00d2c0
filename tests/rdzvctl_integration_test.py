#!/usr/bin/env python3
"""rdzvctl against a real rdzvd and real rdzv-agents on loopback: health, status, abort, and
rdzvd's readiness notification for systemd (Type=notify).

Inputs (ctest sets them): RDZVD_BIN, RDZV_AGENT_BIN, RDZVCTL_BIN.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "testing"))
from rdzvd_process import Rdzvd  # noqa: E402

RDZVCTL = os.environ.get("RDZVCTL_BIN", "")


def rdzvctl(*args, env=None):
    """Runs rdzvctl; returns (exit code, stdout, stderr)."""
    full_env = dict(os.environ, RDZV_CONFIG="/dev/null")
    full_env.pop("RDZV_ENDPOINT", None)
    full_env.update(env or {})
    done = subprocess.run([RDZVCTL, *args], capture_output=True, text=True, timeout=60,
                          env=full_env)
    return done.returncode, done.stdout, done.stderr


def wait_until(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError("condition not met within %d s" % timeout)


class RdzvctlTest(unittest.TestCase):

    def setUp(self):
        if not RDZVCTL or not os.access(RDZVCTL, os.X_OK):
            self.fail("RDZVCTL_BIN=%r is not an executable (ctest sets it)" % RDZVCTL)

    def test_health_status_and_abort_of_a_real_job(self):
        directory = tempfile.mkdtemp(prefix="rdzvctl-test-")
        notify_path = os.path.join(directory, "notify")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        notify.settimeout(30)
        try:
            with Rdzvd(env=dict(os.environ, NOTIFY_SOCKET=notify_path)) as rdzvd:
                # systemd hears READY=1 once rdzvd serves.
                self.assertEqual(notify.recv(256), b"READY=1")
                code, out, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "health")
                self.assertEqual((code, out), (0, "%s SERVING\n" % rdzvd.endpoint), err)
                # The endpoint from the environment, as the agent takes it.
                code, out, _ = rdzvctl("status", env={"RDZV_ENDPOINT": rdzvd.endpoint})
                self.assertEqual((code, out), (0, "no jobs\n"))

                # One of two nodes has joined: node 1 is missing.
                rdzvd.agent("waiting", 0, 2, "true")
                code, out, err = wait_until(lambda: (lambda r: r if "waiting" in r[1] else None)(
                    rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "status")))
                self.assertEqual(code, 0, err)
                row = [line for line in out.splitlines() if line.startswith("waiting")][0]
                self.assertEqual(row.split(), ["waiting", "filling", "1", "1/2", "-", "n0", "[1]",
                                               "-"])

                # A running job, aborted by the operator: its agents stop and say why.
                running = [rdzvd.agent("long", node, 2, "sleep 120") for node in (0, 1)]
                wait_until(lambda: '"state":"running"' in rdzvctl(
                    "--rdzv-endpoint", rdzvd.endpoint, "status", "long", "--json")[1])
                code, out, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "abort", "long",
                                         "--reason", "node maintenance")
                self.assertEqual(code, 0, err)
                self.assertEqual(out, "job long ended: aborted with rdzvctl: node maintenance\n")
                for agent in running:
                    self.assertNotEqual(agent.wait(timeout=60), 0)
                    self.assertIn("node maintenance", Rdzvd.output(agent))
                code, out, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "--json", "status",
                                         "long")
                self.assertEqual(code, 0, err)
                job = json.loads(out)["jobs"][0]
                self.assertEqual(job["state"], "ended")
                self.assertEqual(job["abort"]["reason"], "aborted with rdzvctl: node maintenance")

                # Mistakes are one line that says what to do.
                code, _, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "abort", "nosuchjob",
                                       "--reason", "x")
                self.assertEqual(code, 1)
                self.assertIn("no job nosuchjob", err)
                self.assertEqual(err.count("\n"), 1)

                self.assertEqual(rdzvd.stop(), 0, rdzvd.log())
                self.assertEqual(notify.recv(256), b"STOPPING=1")
                code, _, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "--timeout", "2",
                                       "health")
                self.assertEqual(code, 1)
                self.assertIn("did not answer", err)
        finally:
            notify.close()
            os.unlink(notify_path)
            os.rmdir(directory)

    def test_no_endpoint_is_a_usage_error(self):
        code, _, err = rdzvctl("status")
        self.assertEqual(code, 2)
        self.assertIn("--rdzv-endpoint", err)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    unittest.main()
