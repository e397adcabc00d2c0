#!/usr/bin/env python3
"""rdzvctl against a real rdzvd and real rdzv-agents on loopback: health, status, watch, abort,
the endpoint from a config file, rdzvctl run by a worker (its job by default, with its agent's
credentials), the missing nodes named from a Slurm step's node list, and rdzvd's readiness
notification for systemd (Type=notify).

Inputs (ctest sets them): RDZVD_BIN, RDZV_AGENT_BIN, RDZVCTL_BIN.
"""
import json
import os
import shutil
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


def slurm_step_env(node, nodes=3):
    """The environment srun gives the task on node NODE of a NODES-node step (one task per node,
    nodes n0..n{NODES-1}), without the Slurm variables this process may have."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RDZV_"))}
    env.update(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID=str(node),
               SLURM_NODEID=str(node), SLURM_LOCALID="0", SLURM_NNODES=str(nodes),
               SLURM_STEP_NODELIST="n[0-%d]" % (nodes - 1), SLURM_STEP_NUM_TASKS=str(nodes),
               SLURM_STEP_TASKS_PER_NODE="1(x%d)" % nodes, SLURMD_NODENAME="n%d" % node,
               RDZV_CONFIG="/dev/null")
    return env


def status_row(endpoint, job):
    """rdzvctl status's table row of JOB, split into its columns, once rdzvd lists the job."""
    def row():
        code, out, _ = rdzvctl("--rdzv-endpoint", endpoint, "status", "--all")
        rows = [line.split() for line in out.splitlines() if line.startswith(job + " ")]
        return rows[0] if code == 0 and rows else None
    return wait_until(row)


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

    def test_missing_nodes_named_from_the_steps_node_list(self):
        with Rdzvd() as rdzvd:
            # Node 0 of a 3-node Slurm step has joined; its agent told rdzvd the step's nodes.
            rdzvd.agent("named", 0, 3, "true", env=slurm_step_env(0))
            self.assertEqual(status_row(rdzvd.endpoint, "named"),
                             ["named", "filling", "1", "1/3", "-", "n0", "n[1-2]", "-"])
            code, out, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "--json", "status",
                                     "named")
            self.assertEqual(code, 0, err)
            self.assertEqual(json.loads(out)["jobs"][0]["node_list"], "n[0-2]")
            # Node 2 joins: only node 1 is missing, by name.
            rdzvd.agent("named", 2, 3, "true", env=slurm_step_env(2))
            wait_until(lambda: status_row(rdzvd.endpoint, "named")[3] == "2/3")
            self.assertEqual(status_row(rdzvd.endpoint, "named")[6], "n1")
            # --nodelist still names them for a job whose agents gave no list.
            rdzvd.agent("unnamed", 0, 2, "true")
            self.assertEqual(status_row(rdzvd.endpoint, "unnamed")[6], "[1]")
            code, out, _ = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "status", "unnamed",
                                   "--nodelist", "n[0-1]")
            self.assertEqual(out.splitlines()[1].split()[6], "n1")

    def test_a_worker_sees_its_own_job(self):
        directory = tempfile.mkdtemp(prefix="rdzvctl-worker-")
        try:
            # Token mode: the worker's rdzvctl needs the job's token, which the agents were given
            # by a path relative to their directory; the worker runs rdzvctl from elsewhere.
            token = os.path.join(directory, "token")
            with open(token, "w") as f:
                f.write(os.urandom(32).hex() + "\n")
            os.chmod(token, 0o600)
            env = dict(os.environ, RDZV_CONFIG="/dev/null", RDZVCTL=RDZVCTL, OUT=directory)
            env.pop("RDZV_ENDPOINT", None)
            with Rdzvd(auth=("--auth", "token")) as rdzvd:
                # Another job of the same owner, which the workers' status leaves out.
                rdzvd.agent("other", 0, 2, "true", env=env, cwd=directory,
                            args=("--rdzv-token-file", "token"))
                wait_until(lambda: "other" in rdzvctl("--rdzv-endpoint", rdzvd.endpoint,
                                                      "--rdzv-token-file", token, "status")[1])
                worker = 'cd / && "$RDZVCTL" status --json > "$OUT/status-$RANK.json"'
                agents = [rdzvd.agent("mine", node, 2, worker, env=env, cwd=directory,
                                      args=("--rdzv-token-file", "token")) for node in (0, 1)]
                for agent in agents:
                    self.assertEqual(agent.wait(timeout=60), 0, Rdzvd.output(agent))
                for rank in (0, 1):
                    with open(os.path.join(directory, "status-%d.json" % rank)) as f:
                        jobs = json.load(f)["jobs"]
                    self.assertEqual([j["job_id"] for j in jobs], ["mine"])
                    self.assertEqual(jobs[0]["state"], "running")
                    self.assertEqual(jobs[0]["world_size"], 2)
                    self.assertEqual(jobs[0]["joined"], 2)
                    self.assertEqual(sorted(a["host"] for a in jobs[0]["agents"]), ["n0", "n1"])
                # Without the token rdzvd does not answer (so the worker had it from its agent).
                code, _, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "status")
                self.assertEqual(code, 1, err)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def test_watch_health_json_and_endpoint_from_a_config_file(self):
        directory = tempfile.mkdtemp(prefix="rdzvctl-config-")
        try:
            with Rdzvd() as rdzvd:
                rdzvd.agent("waiting", 0, 2, "true")
                status_row(rdzvd.endpoint, "waiting")
                # Two refreshes, each a header line (time and endpoint) and the table.
                code, out, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "watch", "--count",
                                         "2", "--interval", "0.2")
                self.assertEqual(code, 0, err)
                headers = [l for l in out.splitlines() if l.endswith("  " + rdzvd.endpoint)]
                self.assertEqual(len(headers), 2, out)
                for header in headers:
                    self.assertRegex(header, r"^\d\d:\d\d:\d\d  ")
                self.assertEqual(len([l for l in out.splitlines() if l.startswith("waiting ")]),
                                 2, out)
                code, out, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "--json", "watch",
                                         "--count", "2", "--interval", "0.2")
                self.assertEqual(code, 0, err)
                snapshots = [json.loads(line) for line in out.splitlines()]
                self.assertEqual(len(snapshots), 2, out)
                for snapshot in snapshots:
                    self.assertEqual([j["job_id"] for j in snapshot["jobs"]], ["waiting"])

                code, out, err = rdzvctl("--rdzv-endpoint", rdzvd.endpoint, "--json", "health")
                self.assertEqual(code, 0, err)
                self.assertEqual(json.loads(out), {"status": "SERVING"})

                # The endpoint from the file RDZV_CONFIG names, as a site's /etc/rdzv.conf.
                config = os.path.join(directory, "rdzv.conf")
                with open(config, "w") as f:
                    f.write("# the site's rendezvous server\nRDZV_ENDPOINT=%s\n" % rdzvd.endpoint)
                code, out, err = rdzvctl("status", "waiting", env={"RDZV_CONFIG": config})
                self.assertEqual(code, 0, err)
                self.assertEqual(out.splitlines()[1].split()[:2], ["waiting", "filling"])
                code, out, err = rdzvctl("health", env={"RDZV_CONFIG": config})
                self.assertEqual((code, out), (0, "%s SERVING\n" % rdzvd.endpoint), err)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def test_no_endpoint_is_a_usage_error(self):
        code, _, err = rdzvctl("status")
        self.assertEqual(code, 2)
        self.assertIn("--rdzv-endpoint", err)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    unittest.main()
