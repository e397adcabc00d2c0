#!/usr/bin/env python3
"""Attacks on a job under a real Slurm (the local 3-node cluster of deploy/slurm/local-cluster.sh)
by a second real user, nobody, while the job runs.

The victim is `srun -N3 rdzv-agent` as root, with MUNGE (the cluster's munged) and the rendezvous
hosted by node 0's agent. Before it starts, nobody's fake rendezvous server takes the job's first
candidate port; while it runs, nobody's real rdzv-agent tries to join the job and nobody's raw
client (auth_probe) reports a failure in it and leaves it. The victim must run to its end with exit
0 and the right rank table, its agents skipping the fake server; every attacker must get one clear
line and a non-zero exit.

Inputs are those of test_slurm.py, and AUTH_PROBE_BIN (ctest sets it). Run as root with the cluster
up (ctest -L slurm starts it through the slurm_cluster fixture).
"""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_slurm  # noqa: E402  (the shared setup, environment and cleanup)
from test_slurm import AGENT, SlurmTestCase, base_env, marked_pids  # noqa: E402

AUTH_PROBE = os.environ.get("AUTH_PROBE_BIN", "")

# Marks its start, holds, then writes its environment: the attacks happen while every rank runs.
WORKER = textwrap.dedent("""\
    import json, os, sys, time
    out_dir, hold = sys.argv[1], float(sys.argv[2])
    rank = os.environ["RANK"]
    open(os.path.join(out_dir, "started-" + rank), "w").close()
    time.sleep(hold)
    with open(os.path.join(out_dir, ".worker-" + rank), "w") as f:
        json.dump({"env": dict(os.environ)}, f)
    os.rename(os.path.join(out_dir, ".worker-" + rank), os.path.join(out_dir, "worker-" + rank))
""")


def setUpModule():
    test_slurm.setUpModule()
    if not AUTH_PROBE or not os.access(AUTH_PROBE, os.X_OK):
        raise RuntimeError(f"AUTH_PROBE_BIN={AUTH_PROBE!r} is not an executable (ctest sets it)")


def derived_port(job_id, step_id):
    """The first port the agent of node 0 tries for a job step (client/agent/core/agent_options.cc)."""
    h = 2166136261
    for ch in f"{job_id}.{step_id}".encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return 20000 + h % 10000


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class SecurityTest(SlurmTestCase):

    def setUp(self):
        self.marker = uuid.uuid4().hex
        self.addCleanup(self.assert_nothing_left)
        super().setUp()

    def assert_nothing_left(self):
        deadline = time.monotonic() + 20
        while marked_pids(self.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(marked_pids(self.marker), [], "processes of the job left running")

    def as_nobody(self, argv, timeout=None):
        """Runs ARGV as nobody; with TIMEOUT waits and returns (code, stdout + stderr)."""
        env = base_env(RDZV_TEST_MARKER=self.marker)
        p = subprocess.Popen(["runuser", "-u", "nobody", "--", *argv], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd="/", env=env, start_new_session=True)
        self.addCleanup(self.kill_group, p)
        if timeout is None:
            return p
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out

    @staticmethod
    def kill_group(p):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)

    def job_field(self, job_id, field):
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=base_env(),
                             capture_output=True, text=True, timeout=30).stdout
        for word in out.split():
            if word.startswith(field + "="):
                return word[len(field) + 1:]
        return ""

    def test_attacks_by_another_user_leave_the_job_running_to_its_end(self):
        out_dir = self.out_dir()
        os.chmod(out_dir, 0o755)
        worker = os.path.join(self.tmp, "worker_hold.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        script = os.path.join(self.tmp, "job.sbatch")
        with open(script, "w") as f:
            f.write(f"#!/bin/bash\nexec srun -N3 --ntasks-per-node=1 {AGENT} --join-timeout 60 "
                    f"-- {sys.executable} {worker} {out_dir} 8\n")
        output = os.path.join(self.tmp, "slurm-%j.out")
        # Held, so that the fake server can take the job's port before any agent starts.
        submitted = subprocess.run(
            ["sbatch", "--hold", "--parsable", "-N3", f"--job-name={self.job_name}",
             f"--chdir={self.tmp}", f"--output={output}", script],
            env=base_env(RDZV_TEST_MARKER=self.marker), capture_output=True, text=True,
            timeout=30)
        self.assertEqual(submitted.returncode, 0, submitted.stderr)
        job_id = submitted.stdout.strip().split(";")[0]
        job = f"slurm-{job_id}.0"
        port = derived_port(job_id, 0)
        self.assertTrue(port_free(port) and port_free(port + 1),
                        f"ports {port} and {port + 1} are taken; another cluster's job?")

        fake = self.as_nobody([AUTH_PROBE, f"127.0.0.1:{port}", "munge:", "serve", job])
        self.assertEqual(fake.stdout.readline().strip(), "serving")
        released = subprocess.run(["scontrol", "release", job_id], env=base_env(),
                                  capture_output=True, text=True, timeout=30)
        self.assertEqual(released.returncode, 0, released.stderr)

        def all_started():
            return len([n for n in os.listdir(out_dir) if n.startswith("started-")]) == 3
        self.wait_for(all_started, 60, "the job's three ranks did not start")
        real = f"127.0.0.1:{port + 1}"  # node 0 found the fake's port taken

        # nobody's agent joining the same job id at its server: refused by uid.
        code, out = self.as_nobody([AGENT, "--rdzv-endpoint", real, "--rdzv-id", job, "--nnodes",
                                    "3", "--join-timeout", "10", "--", "true"], timeout=60)
        self.assertEqual(code, 1, out)
        self.assertIn("this rendezvous server belongs to uid 0's job; uid 65534 may not use it",
                      out)
        # nobody's raw client reporting a failure in the job, and leaving it.
        for action, why in (("report", "uid 65534 may not use it"),
                            ("leave", "uid 65534 may not use it")):
            code, out = self.as_nobody([AUTH_PROBE, real, "munge:", action, job, "n1/agent"],
                                       timeout=60)
            self.assertEqual(code, 1, out)
            self.assertIn("7: ", out)  # PERMISSION_DENIED
            self.assertIn(why, out)

        self.wait_for(lambda: self.job_field(job_id, "JobState") in ("COMPLETED", "FAILED",
                                                                      "CANCELLED", "TIMEOUT"),
                      120, f"job {job_id} did not end")
        with open(output.replace("%j", job_id)) as f:
            log = f.read()
        self.assertEqual(self.job_field(job_id, "JobState"), "COMPLETED", log)
        self.assertEqual(self.job_field(job_id, "ExitCode"), "0:0", log)
        self.check_per_node(self.records(out_dir, 3), nodes=3, nproc=1)
        # Nodes 1 and 2 tried the fake first and said so, once each.
        skipped = [line for line in log.splitlines()
                   if f"the server at 127.0.0.1:{port} did not prove" in line]
        self.assertEqual(len(skipped), 2, log)
        self.assertIn("it runs as uid 65534, and the server of this job runs as uid 0", skipped[0])

        # Alone with the fake (the job's server is gone), an agent gives up with one line.
        code, out = self.run_lone_agent(job_id, port)
        self.assertEqual(code, 1, out)
        self.assertIn("Another user's process may be listening", out)
        self.assertIn(f"the server at 127.0.0.1:{port} did not prove", out)

    def run_lone_agent(self, job_id, port):
        """Node 1's agent of the job's step, alone: root's srun into a new step would get another
        port, so it is run here with that step's variables."""
        env = base_env(RDZV_TEST_MARKER=self.marker, SLURM_JOB_ID=job_id, SLURM_STEP_ID="0",
                       SLURM_PROCID="1", SLURM_NODEID="1", SLURM_LOCALID="0",
                       SLURM_STEP_NUM_NODES="3", SLURM_STEP_NUM_TASKS="3",
                       SLURM_STEP_TASKS_PER_NODE="1(x3)", SLURM_STEP_NODELIST="n[1-3]")
        done = subprocess.run([AGENT, "--join-timeout", "3", "--", "true"], env=env,
                              capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout + done.stderr


if __name__ == "__main__":
    unittest.main()
