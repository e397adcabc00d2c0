#!/usr/bin/env python3
"""rdzv-agent under a real Slurm: the local 3-node cluster of deploy/slurm/local-cluster.sh.

Each test launches jobs the way users do (srun, sbatch) and checks what they would check: the
environment every worker saw, the exit code, the output, and that no process is left behind.

Inputs (ctest sets them; see tests/CMakeLists.txt):
  RDZV_AGENT_BIN   the rdzv-agent binary
  RDZVD_BIN        the rdzvd binary
  RDZVCTL_BIN      the rdzvctl binary (StatusTest)
  RDZV_SOURCE_DIR  the repository root (default: two levels above this file)
  RDZV_TORCH_PYTHON  a Python with torch for deploy/examples/train_ddp.py (default
                     /usr/bin/python3)

The cluster must be up (deploy/slurm/local-cluster.sh start, as root; ctest's slurm_cluster
fixture starts and stops it). When it is not, every test fails with a message that says so:
this suite never passes by skipping.

  sudo deploy/slurm/local-cluster.sh start
  RDZV_AGENT_BIN=build/client/agent/rdzv-agent RDZVD_BIN=build/server/rdzvd \
      /usr/bin/python3 tests/slurm/test_slurm.py -v
"""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import uuid

SOURCE_DIR = os.path.abspath(
    os.environ.get("RDZV_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", ".."))
LOCAL_CLUSTER = os.path.join(SOURCE_DIR, "deploy", "slurm", "local-cluster.sh")
TRAIN_DDP = os.path.join(SOURCE_DIR, "deploy", "examples", "train_ddp.py")
TORCH_PYTHON = os.environ.get("RDZV_TORCH_PYTHON") or "/usr/bin/python3"
AGENT = os.environ.get("RDZV_AGENT_BIN", "")
RDZVD = os.environ.get("RDZVD_BIN", "")
RDZVCTL = os.environ.get("RDZVCTL_BIN", "")

SLURM_CONF = ""  # set by setUpModule from `local-cluster.sh env`

# Writes the worker's environment, pid and start/end times to DIR/worker-*.json, after holding
# for SECONDS (so that concurrent jobs overlap). Only the standard library: any python3 runs it.
WORKER_SOURCE = textwrap.dedent("""\
    import json, os, sys, time
    out_dir = sys.argv[1]
    hold = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    start = time.time()
    time.sleep(hold)
    record = {"env": dict(os.environ), "pid": os.getpid(), "start": start, "end": time.time()}
    name = "worker-%s-%s-%d.json" % (os.environ.get("SLURM_PROCID"),
                                     os.environ.get("LOCAL_RANK"), os.getpid())
    tmp = os.path.join(out_dir, "." + name)
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, os.path.join(out_dir, name))
    print("rank %s wrote %s" % (os.environ.get("RANK"), name), flush=True)
""")

# The variables rdzv-agent promises its workers; each table row below checks them all.
TABLE_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "GROUP_WORLD_SIZE", "NODE_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
              "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


def setUpModule():
    global SLURM_CONF
    problems = []
    if os.geteuid() != 0:
        problems.append("these tests need root: the local cluster's slurmd's run jobs as root "
                        "(run ctest -L slurm as root)")
    for name, path in (("RDZV_AGENT_BIN", AGENT), ("RDZVD_BIN", RDZVD)):
        if not path or not os.access(path, os.X_OK):
            problems.append(f"{name}={path!r} is not an executable; build the rdzv-agent and "
                            "rdzvd targets and set it (ctest does)")
    for tool in ("srun", "sbatch", "scancel"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not on PATH; install slurm-wlm "
                            "(deploy/slurm/local-cluster.sh start does)")
    if problems:
        raise RuntimeError("cannot run the Slurm tests: " + "; ".join(problems))

    env_out = subprocess.run([LOCAL_CLUSTER, "env"], capture_output=True, text=True, timeout=30)
    match = re.search(r"^export SLURM_CONF=(.+)$", env_out.stdout, re.M)
    if env_out.returncode != 0 or not match:
        raise RuntimeError(f"{LOCAL_CLUSTER} env failed: {env_out.stderr.strip()}")
    SLURM_CONF = shlex.split(match.group(1))[0]
    # base_env() drops RDZV_*, and with it the RDZV_SLURM_* that say which local cluster this is.
    cluster = {k: v for k, v in os.environ.items() if k.startswith("RDZV_SLURM_")}
    status = subprocess.run([LOCAL_CLUSTER, "status"], capture_output=True, text=True,
                            timeout=60, env=base_env(**cluster))
    if status.returncode != 0:
        raise RuntimeError(
            "the local Slurm cluster is not up (local-cluster.sh status: "
            f"{status.stderr.strip() or status.stdout.strip()}); start it with "
            f"{LOCAL_CLUSTER} start as root (ctest -L slurm does this through the "
            "slurm_cluster fixture)")


def base_env(**extra):
    """This process's environment without anything that would change what the agent does:
    no SLURM_*/SRUN_*/SBATCH_* (the tests may run inside an allocation) and no RDZV_*. A site
    /etc/rdzv.conf is masked with an empty RDZV_CONFIG. Then SLURM_CONF and EXTRA."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "RDZV_"))}
    env["RDZV_CONFIG"] = os.devnull
    if SLURM_CONF:
        env["SLURM_CONF"] = SLURM_CONF
    env.update({k: str(v) for k, v in extra.items()})
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def marked_pids(marker):
    """Pids of live processes whose environment holds RDZV_TEST_MARKER=MARKER."""
    needle = f"RDZV_TEST_MARKER={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue  # gone, or a kernel thread
    return found


class SlurmTestCase(unittest.TestCase):
    """A temp dir, a unique Slurm job name, and cleanup of every job, srun and rdzvd started."""

    maxDiff = None  # the rank tables are compared whole

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="rdzv-slurm-test-")
        os.chmod(self.tmp, 0o755)
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.job_name = "rdzv-test-" + uuid.uuid4().hex[:12]
        self.procs = []
        self.addCleanup(self.stop_all)
        self.worker = os.path.join(self.tmp, "worker.py")
        with open(self.worker, "w") as f:
            f.write(WORKER_SOURCE)

    def wait_for(self, condition, timeout, what):
        """Polls CONDITION every 0.1 s; fails the test naming WHAT after TIMEOUT seconds."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() >= deadline:
                self.fail(f"{what}: not within {timeout}s")
            time.sleep(0.1)

    def stop_all(self):
        running = [p for p in self.procs if p.poll() is None]
        # scancel first: killing srun alone can leave its tasks running on the nodes.
        subprocess.run(["scancel", "--name", self.job_name], env=base_env(),
                       capture_output=True, timeout=30)
        for p in running:
            if p.args and os.path.basename(str(p.args[0])) == "rdzvd":
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in running:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def out_dir(self, name="out"):
        path = os.path.join(self.tmp, name)
        os.makedirs(path, exist_ok=True)
        return path

    def start(self, argv, env):
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=self.tmp, env=env,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def start_srun(self, srun_args, command, env=None, agent_args=()):
        argv = (["srun", f"--job-name={self.job_name}", *srun_args, AGENT, *agent_args, "--",
                 *command])
        return self.start(argv, env or base_env())

    def finish(self, proc, timeout):
        """Waits for PROC; returns (code, stdout, stderr, seconds). Fails the test on timeout."""
        started = time.monotonic()
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop_all()
            out, err = proc.communicate(timeout=30)
            self.fail(f"{shlex.join(proc.args)} did not finish within {timeout}s\n"
                      f"stdout:\n{out}\nstderr:\n{err}")
        return proc.returncode, out, err, time.monotonic() - started

    def srun(self, srun_args, command, env=None, agent_args=(), timeout=120):
        proc = self.start_srun(srun_args, command, env, agent_args)
        code, out, err, _ = self.finish(proc, timeout)
        self.assertEqual(code, 0, f"{shlex.join(proc.args)} failed\nstdout:\n{out}\n"
                         f"stderr:\n{err}")
        return out, err

    def sbatch(self, script, sbatch_args=(), script_args=(), env=None, timeout=300):
        """sbatch --wait SCRIPT; returns (exit code, job id, output file text)."""
        output = os.path.join(self.tmp, "slurm-%j.out")
        argv = ["sbatch", "--wait", "--parsable", f"--job-name={self.job_name}",
                f"--chdir={self.tmp}", f"--output={output}", *sbatch_args, script, *script_args]
        proc = self.start(argv, env or base_env())
        code, out, err, _ = self.finish(proc, timeout)
        job_id = out.strip().split(";")[0]
        self.assertRegex(job_id, r"^\d+$", f"sbatch printed no job id\nstderr:\n{err}")
        with open(output.replace("%j", job_id)) as f:
            return code, job_id, f.read()

    def start_rdzvd(self):
        """Starts rdzvd on a free loopback port (all nodes of the local cluster are this
        machine) and returns HOST:PORT once it accepts connections."""
        endpoint = f"127.0.0.1:{free_port()}"
        log = open(os.path.join(self.tmp, "rdzvd.log"), "w")
        self.addCleanup(log.close)
        proc = subprocess.Popen([RDZVD, "--listen", endpoint], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, env=base_env(),
                                start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                with open(log.name) as f:
                    self.fail(f"rdzvd --listen {endpoint} exited: {f.read()}")
            try:
                socket.create_connection(("127.0.0.1", int(endpoint.split(":")[1])), 1).close()
                return endpoint
            except OSError:
                self.assertLess(time.monotonic(), deadline, "rdzvd did not start listening")
                time.sleep(0.05)

    def records(self, out_dir, expected):
        names = sorted(n for n in os.listdir(out_dir) if n.startswith("worker-"))
        records = []
        for n in names:
            with open(os.path.join(out_dir, n)) as f:
                records.append(json.load(f))
        self.assertEqual(len(records), expected,
                         f"expected {expected} workers to report, got {names}")
        return records

    def assert_one_job(self, envs):
        """Every worker belongs to the same Slurm step and rendezvous, and one master."""
        steps = {(e["SLURM_JOB_ID"], e["SLURM_STEP_ID"]) for e in envs}
        self.assertEqual(len(steps), 1, f"workers from several steps: {steps}")
        masters = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}
        self.assertEqual(len(masters), 1, f"workers disagree on the master: {masters}")
        addr, port = masters.pop()
        socket.inet_aton(addr)  # an address the others can connect to, not a node name
        self.assertTrue(1 <= int(port) <= 65535, port)
        job_id, step_id = steps.pop()
        return f"slurm-{job_id}.{step_id}"

    def assert_table(self, actual, expected):
        key = lambda row: int(row["RANK"])
        self.assertEqual(sorted(actual, key=key), sorted(expected, key=key))

    def check_per_node(self, records, nodes, nproc):
        """srun -N NODES --ntasks-per-node=1 rdzv-agent --nproc-per-node NPROC: node i runs
        ranks i*NPROC .. i*NPROC+NPROC-1, in Slurm's node order."""
        envs = [r["env"] for r in records]
        run_id = self.assert_one_job(envs)
        world = nodes * nproc
        expected = []
        for node in range(nodes):
            for local in range(nproc):
                rank = node * nproc + local
                expected.append({
                    "SLURM_NODEID": str(node), "RANK": str(rank), "LOCAL_RANK": str(local),
                    "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(nproc),
                    "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes),
                    "NODE_RANK": str(node), "ROLE_RANK": str(rank),
                    "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "default",
                    "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0"})
        actual = [{k: e.get(k) for k in ("SLURM_NODEID",) + TABLE_KEYS} for e in envs]
        self.assert_table(actual, expected)
        return envs

    def check_per_task(self, records, tasks_per_node):
        """srun -N len(TASKS_PER_NODE) -n sum(TASKS_PER_NODE) rdzv-agent: each task is one rank
        and its ranks are Slurm's (block distribution: node 0 takes the first tasks)."""
        envs = [r["env"] for r in records]
        run_id = self.assert_one_job(envs)
        world = sum(tasks_per_node)
        expected = []
        proc_id = 0
        for node, count in enumerate(tasks_per_node):
            for local in range(count):
                expected.append({
                    "SLURM_PROCID": str(proc_id), "SLURM_LOCALID": str(local),
                    "SLURM_NODEID": str(node), "SLURM_NTASKS": str(world),
                    "RANK": str(proc_id), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(count), "GROUP_RANK": str(node),
                    "GROUP_WORLD_SIZE": str(len(tasks_per_node)), "NODE_RANK": str(node),
                    "ROLE_RANK": str(proc_id), "ROLE_WORLD_SIZE": str(world),
                    "ROLE_NAME": "default", "TORCHELASTIC_RUN_ID": run_id,
                    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"})
                proc_id += 1
        slurm_keys = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS")
        actual = [{k: e.get(k) for k in slurm_keys + TABLE_KEYS} for e in envs]
        self.assert_table(actual, expected)
        return envs


class PerNodeTest(SlurmTestCase):
    """One agent per node, several workers each; the rendezvous hosted by node 0's agent."""

    def test_three_nodes_two_workers_each(self):
        out_dir = self.out_dir()
        out, _ = self.srun(["-N3", "--ntasks-per-node=1"], [sys.executable, self.worker, out_dir],
                           agent_args=["--nproc-per-node", "2"])
        envs = self.check_per_node(self.records(out_dir, 6), nodes=3, nproc=2)
        # Node 0's agent hosts the rendezvous; every agent found it there.
        endpoints = {e["RDZV_ENDPOINT"] for e in envs}
        self.assertEqual(len(endpoints), 1, endpoints)
        # Every output line carries its rank.
        for rank in range(6):
            self.assertRegex(out, rf"(?m)^\[{rank}\]: rank {rank} wrote worker-")

    def test_default_is_one_worker_per_node(self):
        out_dir = self.out_dir()
        self.srun(["-N3", "--ntasks-per-node=1"], [sys.executable, self.worker, out_dir])
        self.check_per_node(self.records(out_dir, 3), nodes=3, nproc=1)


class PerTaskTest(SlurmTestCase):
    """Several tasks on a node: each agent is one rank, RANK == SLURM_PROCID."""

    def test_two_nodes_four_tasks(self):
        out_dir = self.out_dir()
        self.srun(["-N2", "-n4"], [sys.executable, self.worker, out_dir])
        self.check_per_task(self.records(out_dir, 4), tasks_per_node=[2, 2])

    def test_two_nodes_three_tasks_uneven(self):
        out_dir = self.out_dir()
        self.srun(["-N2", "-n3"], [sys.executable, self.worker, out_dir])
        self.check_per_task(self.records(out_dir, 3), tasks_per_node=[2, 1])


class HeadNodeServerTest(SlurmTestCase):
    """A site's rdzvd on the head node, named by RDZV_ENDPOINT or by a config file."""

    def test_endpoint_from_environment(self):
        endpoint = self.start_rdzvd()
        out_dir = self.out_dir()
        self.srun(["-N3", "--ntasks-per-node=1"], [sys.executable, self.worker, out_dir],
                  env=base_env(RDZV_ENDPOINT=endpoint), agent_args=["--nproc-per-node", "2"])
        envs = self.check_per_node(self.records(out_dir, 6), nodes=3, nproc=2)
        self.assertEqual({e["RDZV_ENDPOINT"] for e in envs}, {endpoint})

    def test_endpoint_from_config_file(self):
        endpoint = self.start_rdzvd()
        config = os.path.join(self.tmp, "rdzv.conf")
        with open(config, "w") as f:
            f.write(f"# the site's rendezvous server\nRDZV_ENDPOINT={endpoint}\n")
        out_dir = self.out_dir()
        self.srun(["-N2", "-n3"], [sys.executable, self.worker, out_dir],
                  env=base_env(RDZV_CONFIG=config))
        envs = self.check_per_task(self.records(out_dir, 3), tasks_per_node=[2, 1])
        self.assertEqual({e["RDZV_ENDPOINT"] for e in envs}, {endpoint})


class StatusTest(SlurmTestCase):
    """rdzvctl against the head-node rdzvd while a job fills: the node whose agent has not
    joined is named, from the step's node list its agents gave rdzvd."""

    def test_missing_node_is_named(self):
        if not RDZVCTL or not os.access(RDZVCTL, os.X_OK):
            self.fail(f"RDZVCTL_BIN={RDZVCTL!r} is not an executable; build rdzvctl and set it "
                      "(ctest does)")
        endpoint = self.start_rdzvd()
        go = os.path.join(self.tmp, "go")
        out_dir = self.out_dir()
        # The third node's task starts its agent only once the test lets it.
        hold = f'if [ "$SLURM_NODEID" = 2 ]; then while [ ! -e {go} ]; do sleep 0.1; done; fi'
        proc = self.start(["srun", f"--job-name={self.job_name}", "-N3", "--ntasks-per-node=1",
                           "bash", "-c", hold + '; exec "$@"', "hold", AGENT, "--",
                           sys.executable, self.worker, out_dir],
                          base_env(RDZV_ENDPOINT=endpoint))

        def filling_row():
            done = subprocess.run([RDZVCTL, "--rdzv-endpoint", endpoint, "status"],
                                  capture_output=True, text=True, timeout=60, env=base_env())
            rows = [l.split() for l in done.stdout.splitlines() if l.startswith("slurm-")]
            return rows[0] if rows and rows[0][3] == "2/3" else None

        deadline = time.monotonic() + 60
        row = filling_row()
        while row is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            row = filling_row()
        self.assertIsNotNone(row, "the job never showed two of its three agents")
        # JOB STATE ROUND AGENTS WORLD HOSTS MISSING FAILURE
        self.assertEqual(row[1:], ["filling", "1", "2/3", "-", "n[1-2]", "n3", "-"])
        open(go, "w").close()
        code, out, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, f"stdout:\n{out}\nstderr:\n{err}")
        self.check_per_node(self.records(out_dir, 3), nodes=3, nproc=1)


class ConcurrentJobsTest(SlurmTestCase):
    """Two 3-node jobs at the same time on the same nodes keep to themselves."""

    def run_two_jobs(self, env):
        jobs = []
        for name, nproc in (("a", 2), ("b", 1)):
            out_dir = self.out_dir(name)
            proc = self.start_srun(["-N3", "--ntasks-per-node=1"],
                                   [sys.executable, self.worker, out_dir, "2"], env=env,
                                   agent_args=["--nproc-per-node", str(nproc)])
            jobs.append((proc, out_dir, nproc))
        results = []
        for proc, out_dir, nproc in jobs:
            code, out, err, _ = self.finish(proc, 120)
            self.assertEqual(code, 0, f"{shlex.join(proc.args)} failed\nstdout:\n{out}\n"
                             f"stderr:\n{err}")
            records = self.records(out_dir, 3 * nproc)
            envs = self.check_per_node(records, nodes=3, nproc=nproc)
            results.append((records, envs))
        (rec_a, env_a), (rec_b, env_b) = results
        # The point of the test: both ran at once.
        self.assertLess(max(r["start"] for r in rec_b), min(r["end"] for r in rec_a),
                        "the two jobs did not overlap")
        self.assertLess(max(r["start"] for r in rec_a), min(r["end"] for r in rec_b),
                        "the two jobs did not overlap")
        self.assertNotEqual(env_a[0]["TORCHELASTIC_RUN_ID"], env_b[0]["TORCHELASTIC_RUN_ID"])
        self.assertNotEqual(env_a[0]["MASTER_PORT"], env_b[0]["MASTER_PORT"])
        return env_a, env_b

    def test_embedded_servers(self):
        self.run_two_jobs(base_env())

    def test_shared_head_node_server(self):
        endpoint = self.start_rdzvd()
        env_a, env_b = self.run_two_jobs(base_env(RDZV_ENDPOINT=endpoint))
        self.assertEqual({e["RDZV_ENDPOINT"] for e in env_a + env_b}, {endpoint})


class TorchDdpTest(SlurmTestCase):
    """Real torch.distributed (gloo) DDP across the three nodes."""

    def test_train_ddp(self):
        out, err = self.srun(["-N3", "--ntasks-per-node=1"], [TORCH_PYTHON, TRAIN_DDP],
                             agent_args=["--nproc-per-node", "2"], timeout=300)
        for rank in range(6):
            self.assertRegex(
                out, rf"(?m)^\[{rank}\]: rank {rank}/6 local {rank % 2}/2 node {rank // 2} "
                r"master \S+:\d+ all_reduce ok", f"stderr:\n{err}")
        self.assertRegex(out, r"(?m)^\[0\]: final loss [0-9.]+ after \d+ steps on 6 ranks; "
                         r"replicas identical$")


class FailureTest(SlurmTestCase):
    """One failing worker stops the whole job, on every node, quickly."""

    def test_failing_rank_stops_every_node(self):
        marker = uuid.uuid4().hex
        script = ('if [ "$RANK" = 4 ]; then sleep 1; echo "rank 4 gives up" >&2; exit 3; fi; '
                  'sleep 60; echo "rank $RANK was not stopped"')
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"], ["/bin/sh", "-c", script],
                               env=base_env(RDZV_TEST_MARKER=marker),
                               agent_args=["--nproc-per-node", "2"])
        code, out, err, seconds = self.finish(proc, 90)
        output = out + err
        self.assertEqual(code, 3, output)
        self.assertLess(seconds, 30, f"srun took {seconds:.1f}s to return\n{output}")
        self.assertRegex(output, r"rank 4\b.*exited with code 3")
        self.assertIn("[4]: rank 4 gives up", output)
        self.assertNotIn("was not stopped", output)
        # Nothing of the job survives it: no worker, no agent (zombies do not count).
        deadline = time.monotonic() + 5
        while marked_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = marked_pids(marker)
        self.assertEqual(left, [], "left running: " + "; ".join(
            open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            for p in left if os.path.exists(f"/proc/{p}")))


class SbatchTemplateTest(SlurmTestCase):
    """The deploy/slurm templates, submitted as users would."""

    def template_env(self, **extra):
        return base_env(RDZV_AGENT=AGENT, **extra)

    def test_per_node_template_trains(self):
        # The cluster's nodes have 4 fake GPUs and 8 CPUs: ask for 2 GPUs and 1 CPU instead of
        # the template's 8 and 32. The agent starts one worker per GPU it was given, as the
        # template says; the workers train on the CPU (the GPUs are not real).
        code, job_id, output = self.sbatch(
            os.path.join(SOURCE_DIR, "deploy", "slurm", "ddp-per-node.sbatch"),
            ["--nodes=2", "--gpus-per-node=2", "--cpus-per-task=1"], ["--steps", "5"],
            env=self.template_env(PYTHON=TORCH_PYTHON, TRAIN_SCRIPT=TRAIN_DDP))
        self.assertEqual(code, 0, output)
        for rank in range(4):
            self.assertRegex(
                output, rf"(?m)^\[{rank}\]: rank {rank}/4 local {rank % 2}/2 node {rank // 2} "
                r"master \S+:\d+ all_reduce ok")
        self.assertRegex(output, r"(?m)^\[0\]: final loss [0-9.]+ after 5 steps on 4 ranks; "
                         r"replicas identical$")
        self.assertIn(f"slurm-{job_id}.0", output)

    def without_gpu_requests(self, template):
        # select/linear (the local cluster) rejects any --gpus-per-task, even =0, so the copy
        # drops the template's GPU request lines; everything else is submitted as written.
        with open(os.path.join(SOURCE_DIR, "deploy", "slurm", template)) as f:
            lines = f.read().splitlines(keepends=True)
        kept = [l for l in lines if not re.match(r"#SBATCH\s+--(gpus|gres)", l)]
        self.assertLess(len(kept), len(lines), f"{template} requests no GPUs")
        path = os.path.join(self.tmp, template)
        with open(path, "w") as f:
            f.writelines(kept)
        return path

    def test_per_task_template(self):
        out_dir = self.out_dir()
        code, _, output = self.sbatch(
            self.without_gpu_requests("ddp-per-task.sbatch"),
            ["--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1"], [out_dir],
            env=self.template_env(PYTHON=sys.executable, TRAIN_SCRIPT=self.worker))
        self.assertEqual(code, 0, output)
        self.check_per_task(self.records(out_dir, 4), tasks_per_node=[2, 2])

    def test_templates_are_valid_bash(self):
        for name in sorted(os.listdir(os.path.join(SOURCE_DIR, "deploy", "slurm"))):
            if name.endswith(".sbatch"):
                with self.subTest(template=name):
                    path = os.path.join(SOURCE_DIR, "deploy", "slurm", name)
                    check = subprocess.run(["bash", "-n", path], capture_output=True, text=True,
                                           timeout=30)
                    self.assertEqual(check.returncode, 0, check.stderr)


class AgentExitTest(SlurmTestCase):
    """A job whose workers all succeed exits 0 from every agent, job after job."""

    def test_many_agents_exit_cleanly(self):
        # An agent that does not host the rendezvous used to abort now and then (about 1 in
        # 100) inside gRPC while it destroyed its client after the job; 8 jobs of 23 such
        # agents caught that almost always.
        jobs = 8
        for job in range(1, jobs + 1):
            proc = self.start_srun(["-N3", "-n24"], ["true"])
            code, out, err, _ = self.finish(proc, 120)
            self.assertEqual(code, 0, f"job {job} of {jobs} (24 agents that run `true`) "
                             f"exited {code}:\n{out}{err}")


class MisuseTest(SlurmTestCase):
    """Launched the wrong way, the agent says what to do instead of hanging or guessing."""

    def test_outside_slurm_without_flags(self):
        touched = os.path.join(self.tmp, "ran")
        proc = self.start([AGENT, "--", "touch", touched], base_env())
        code, out, err, _ = self.finish(proc, 30)
        self.assertEqual(code, 2, out + err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, f"expected one line, got:\n{err}")
        self.assertIn("--rdzv-endpoint", lines[0])
        self.assertIn("--standalone", lines[0])
        self.assertFalse(os.path.exists(touched), "the command ran anyway")

    def test_in_batch_script_without_srun(self):
        script = os.path.join(self.tmp, "no-srun.sbatch")
        touched = os.path.join(self.tmp, "ran")
        with open(script, "w") as f:
            f.write(f"#!/bin/bash\nexec {shlex.quote(AGENT)} -- touch {shlex.quote(touched)}\n")
        code, _, output = self.sbatch(script, ["--nodes=2"], timeout=120)
        self.assertEqual(code, 2, output)
        lines = output.strip().splitlines()
        self.assertEqual(len(lines), 1, f"expected one line, got:\n{output}")
        self.assertRegex(lines[0], r"^rdzv-agent: .*\bsrun rdzv-agent\b")
        self.assertFalse(os.path.exists(touched), "the command ran anyway")


if __name__ == "__main__":
    unittest.main()
