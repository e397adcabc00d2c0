#!/usr/bin/env python3
"""The container launch shapes under the local Slurm cluster, in a foreign image (Debian 11,
glibc 2.31, its own Python 3.9 and torch 1.7; tests/containers/make_image.sh) that holds
nothing of rdzv:

- pyxis/enroot (srun --container-image): the srun task runs in the image, and so does the
  self-contained rdzv-agent, mounted read-only from the build's container/ folder;
- Apptainer and enroot with the agent outside (the host build), one container per worker.

bubblewrap stands in for the runtimes (tests/containers/runtime.py, whose bin/ folder goes first
on PATH), each passing on only what the real one passes by default. The sbatch templates of
deploy/slurm run as written. Runs like test_slurm.py, with RDZV_TEST_IMAGE and
RDZV_CONTAINER_DIR (ctest sets them)."""
import json
import os
import re
import shutil
import signal
import sys
import textwrap
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_slurm  # noqa: E402
from test_failures import SIGNAL_WORKER, FailureCase, describe, read_text  # noqa: E402
from test_slurm import AGENT, SOURCE_DIR, TRAIN_DDP, base_env, marked_pids  # noqa: E402

IMAGE = os.environ.get("RDZV_TEST_IMAGE", "")
CONTAINER_DIR = os.environ.get("RDZV_CONTAINER_DIR", "")
RUNTIMES = os.path.join(SOURCE_DIR, "tests", "containers", "bin")
TEMPLATES = os.path.join(SOURCE_DIR, "deploy", "slurm")
ENROOT_CONF = os.path.join(TEMPLATES, "enroot-workers.conf")
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# train_ddp.py (the demo, copied beside it into the job's folder) with the image's Python,
# saying which Python and torch ran it.
DDP_IN_IMAGE = textwrap.dedent("""\
    import os, platform, runpy, sys
    import torch
    print(f"python {platform.python_version()} torch {torch.__version__}", flush=True)
    sys.argv = [os.path.join(os.path.dirname(__file__), "train_ddp.py")] + sys.argv[1:]
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code or 0
    sys.stdout.flush()
    sys.stderr.flush()
    # Debian 11's torch 1.7 aborts at interpreter exit once autograd has run ("terminate
    # called without an active exception"), under any launcher: leave before its destructors.
    os._exit(code)
""")

# A worker for the boundary checks, run in the image: records its environment and what it
# sees, waits until every rank has, then does what its action (RANK=ACTION arguments) says:
# "ok", "hang" (a torch-style file timer that expires in 1 s, then sleeps), "error" (writes
# torch's error file, exits 1), "sleep".
PROBE = textwrap.dedent("""\
    import glob, json, os, sys, time
    out_dir, actions = sys.argv[1], dict(a.split("=") for a in sys.argv[2:])
    rank = os.environ["RANK"]
    record = {"env": dict(os.environ), "pid": os.getpid(), "exe": sys.executable,
              "relays": sorted(glob.glob("/tmp/rdzv-*/relay-*.sock")),
              "python": sys.version.split()[0],
              "run_dir_visible": os.path.isdir(os.path.dirname(
                  os.environ.get("TORCHELASTIC_ERROR_FILE", "/nonexistent/x")))}
    with open(os.path.join(out_dir, ".worker-%s.json" % rank), "w") as f:
        json.dump(record, f)
    os.rename(os.path.join(out_dir, ".worker-%s.json" % rank),
              os.path.join(out_dir, "worker-%s.json" % rank))
    world = int(os.environ["WORLD_SIZE"])
    deadline = time.time() + 60
    while len(glob.glob(os.path.join(out_dir, "worker-*.json"))) < world:
        if time.time() > deadline:
            sys.exit("rank %s: the other ranks never started" % rank)
        time.sleep(0.05)
    action = actions.get(rank, "ok")
    if action == "hang":
        fifo = os.open(os.environ["TORCHELASTIC_TIMER_FILE"], os.O_WRONLY | os.O_NONBLOCK)
        os.write(fifo, json.dumps({"version": 1, "pid": os.getpid(), "scope_id": "step",
                                   "expiration_time": time.time() + 1, "signal": 9}).encode()
                 + b"\\n")
        time.sleep(120)
    elif action == "error":
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
            json.dump({"message": {"message": "ValueError: the image's worker gave up",
                                   "extraInfo": {"py_callstack": "probe.py, line 1"}}}, f)
        sys.exit(1)
    elif action == "sleep":
        time.sleep(120)
""")


def setUpModule():
    test_slurm.setUpModule()
    problems = []
    for name, path in (("RDZV_TEST_IMAGE", IMAGE), ("RDZV_CONTAINER_DIR", CONTAINER_DIR)):
        if not path or not os.path.isdir(path):
            problems.append(f"{name}={path!r} is not a folder (ctest sets it)")
    if problems:
        raise RuntimeError("cannot run the container tests: " + "; ".join(problems))


class ContainerCase(FailureCase):
    def setUp(self):
        super().setUp()
        # The cluster's node names, known to the image's /etc/hosts as a cluster's /etc/hosts
        # (which enroot and Apptainer mount) would know them: there is no scontrol inside.
        self.hosts = os.path.join(self.tmp, "hosts")
        with open("/etc/hosts") as src, open(self.hosts, "w") as f:
            f.write(src.read() + "\n127.0.0.1 n1 n2 n3 n4\n")
        self.pyxis_state = self.out_dir("pyxis")
        shutil.copy(TRAIN_DDP, self.tmp)
        self.script_path = os.path.join(self.tmp, "ddp_in_image.py")
        with open(self.script_path, "w") as f:
            f.write(DDP_IN_IMAGE)
        self.probe = os.path.join(self.tmp, "probe.py")
        with open(self.probe, "w") as f:
            f.write(PROBE)

    def env(self, **extra):
        extra.setdefault("RDZV_TEST_HOSTS_FILE", self.hosts)
        env = super().env(RDZV_TEST_PYXIS_STATE=self.pyxis_state, **extra)
        env["PATH"] = RUNTIMES + os.pathsep + env["PATH"]
        return env

    def pyxis_srun(self, srun_args, agent_args, command, mounts=None, env=None):
        """srun --container-image=IMAGE ... /opt/rdzv/rdzv-agent AGENT_ARGS -- COMMAND."""
        if mounts is None:
            mounts = [f"{CONTAINER_DIR}:/opt/rdzv:ro", "/run/munge:/run/munge",
                      f"{self.tmp}:{self.tmp}"]
        argv = ["srun", f"--job-name={self.job_name}", *srun_args,
                f"--container-image={IMAGE}", f"--container-mounts={','.join(mounts)}",
                f"--container-workdir={self.tmp}", "/opt/rdzv/rdzv-agent", *agent_args, "--",
                *command]
        return self.start(argv, env or self.env())

    def assert_trained_in_image(self, output, nodes, nproc):
        world = nodes * nproc
        for rank in range(world):
            self.assertRegex(
                output, rf"(?m)^\[{rank}\]: rank {rank}/{world} local {rank % nproc}/{nproc} "
                rf"node {rank // nproc} master \S+:\d+ all_reduce ok")
            # The image's Python and torch, not the host's (3.11 and 1.13).
            self.assertRegex(output, rf"(?m)^\[{rank}\]: python 3\.9\.\d+ torch 1\.7\.")
        self.assertRegex(output, rf"(?m)^\[0\]: final loss [0-9.]+ after \d+ steps on {world} "
                         "ranks; replicas identical$")

    def probe_records(self, out_dir, expected):
        records = {}
        for name in os.listdir(out_dir):
            if name.startswith("worker-"):
                with open(os.path.join(out_dir, name)) as f:
                    r = json.load(f)
                records[int(r["env"]["RANK"])] = r
        self.assertEqual(sorted(records), list(range(expected)), out_dir)
        return records

    def check_worker_env(self, records, nodes, nproc):
        """What every runtime must pass: the agent's variables for the worker, Slurm's, and
        the image's own PATH."""
        for rank, r in records.items():
            e = r["env"]
            where = f"rank {rank}: {sorted(e)}"
            self.assertEqual(e["WORLD_SIZE"], str(nodes * nproc), where)
            self.assertEqual(e["LOCAL_RANK"], str(rank % nproc), where)
            self.assertEqual(e["GROUP_RANK"], str(rank // nproc), where)
            self.assertEqual(e["LOCAL_WORLD_SIZE"], str(nproc), where)
            for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                         "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_TIMER_FILE", "SLURM_JOB_ID",
                         "SLURM_PROCID", "RDZV_TEST_MARKER"):
                self.assertIn(name, e, where)
            self.assertEqual(e["PATH"], IMAGE_PATH, where)
            self.assertEqual(r["python"].rsplit(".", 1)[0], "3.9", where)
            self.assertTrue(r["run_dir_visible"], f"rank {rank} cannot see the agent's run "
                            f"directory {e['TORCHELASTIC_ERROR_FILE']}")

    def check_boundary(self, start_job):
        """Two 2-node jobs of two workers per node, started by START_JOB(out_dir, actions):
        in one, rank 1 hangs in a torch file timer, found through the watchdog's FIFO; in the
        other, rank 2 fails and says why in torch's error file. Each ends on every node, its
        sleeping ranks' containers stopped, nothing left. Returns the workers' records."""
        records = None
        for name, actions, cause in (
                ("hang", ["1=hang", "0=sleep", "2=sleep", "3=sleep"],
                 r"^rank 1 hung: timer \"step\" expired"),
                ("error", ["2=error", "0=sleep", "1=sleep", "3=sleep"],
                 r"^rank 2 \(local rank 0, node 1\) on n\d exited with code 1")):
            out_dir = self.out_dir(name)
            proc = start_job(out_dir, actions)
            code, out, err, _ = self.finish(proc, 120)
            output = out + err
            self.assertNotEqual(code, 0, output)
            records = self.probe_records(out_dir, 4)
            self.check_worker_env(records, 2, 2)
            causes = re.findall(r"job slurm-\d+\.\d+ failed: (.*)", output)
            self.assertEqual(len(causes), 2, output)
            for c in causes:
                self.assertRegex(c, cause, output)
            if name == "error":
                self.assertIn("ValueError: the image's worker gave up", output)
            self.assert_nothing_left(10)
        return records


class PyxisTest(ContainerCase):
    """The agent inside the image, as pyxis runs the srun task."""

    def test_template_trains_with_the_images_torch(self):
        code, job_id, output = self.sbatch(
            os.path.join(TEMPLATES, "ddp-enroot-pyxis.sbatch"),
            ["--nodes=2", "--gpus-per-node=2", "--cpus-per-task=1"], ["--steps", "5"],
            env=self.env(IMAGE=IMAGE, RDZV_CONTAINER_DIR=CONTAINER_DIR, PYTHON="python3",
                         TRAIN_SCRIPT=self.script_path,
                         RDZV_HEALTH_CHECK="python3 -c 'import torch.distributed as d; "
                                           "assert d.is_gloo_available()'"),
            timeout=300)
        self.assertEqual(code, 0, output)
        self.assert_trained_in_image(output, nodes=2, nproc=2)
        self.assertEqual(output.count("checking this node's health"), 2, output)
        self.assertIn(f"slurm-{job_id}.0", output)

    def test_a_failing_rank_ends_the_job_at_once_and_leaves_nothing(self):
        script = ('if [ "$RANK" = 3 ]; then sleep 1; date +%s.%N > fail-time; exit 3; fi; '
                  'sleep 60; echo "rank $RANK was not stopped"')
        proc = self.pyxis_srun(["-N2"], ["--nproc-per-node", "2"], ["sh", "-c", script])
        code, out, err, _ = self.finish(proc, 90)
        ended = time.time()
        output = out + err
        self.assertEqual(code, 3, output)
        self.assertRegex(output, r"rank 3\b.*exited with code 3")
        self.assertNotIn("was not stopped", output)
        self.assert_nothing_left(5)
        with open(os.path.join(self.tmp, "fail-time")) as f:
            print(f"failure to srun's return in the container: {ended - float(f.read()):.2f}s",
                  file=sys.stderr)

    def test_an_agent_killed_outright_takes_its_workers_with_it(self):
        proc = self.pyxis_srun(["-N2"], ["--nproc-per-node", "2"],
                               ["sh", "-c", "touch ready-$RANK; sleep 120"])
        self.wait_for(lambda: len([n for n in os.listdir(self.tmp) if n.startswith("ready-")])
                      == 4, 60, "the four workers to start")
        # The agents, not their workers' guards (forks of them): those whose parent is none of
        # them.
        parents = {}
        for pid in marked_pids(self.marker):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)
                if fields[0].endswith("(rdzv-agent"):
                    parents[pid] = int(fields[1].split()[1])
            except OSError:
                continue
        agents = [pid for pid, parent in parents.items() if parent not in parents]
        self.assertEqual(len(agents), 2, describe(marked_pids(self.marker)))
        os.kill(agents[1], signal.SIGKILL)
        code, out, err, _ = self.finish(proc, 90)
        self.assertNotEqual(code, 0, out + err)
        self.assert_nothing_left(10)

    def test_watchdog_and_error_file_inside(self):
        self.check_boundary(lambda out_dir, actions: self.pyxis_srun(
            ["-N2"], ["--nproc-per-node", "2", "--hang-timeout", "auto"],
            ["python3", self.probe, out_dir, *actions]))

    def test_scancel_signal_reaches_every_worker(self):
        out_dir = self.out_dir()
        proc = self.pyxis_srun(["-N2"], ["--nproc-per-node", "2"],
                               ["bash", "-c", SIGNAL_WORKER.format(out=out_dir)])
        self.wait_for(lambda: self.ready_count(out_dir) == 4, 60, "four workers")
        self.scancel("--signal=USR1", self.job_id())
        code, out, err, _ = self.finish(proc, 90)
        self.assertEqual(code, 0, out + err)
        for rank in range(4):
            self.assertEqual(set(read_text(os.path.join(out_dir, f"sig-{rank}")).split()),
                             {"USR1"}, f"rank {rank}\n{out}{err}")
        self.assertNotIn("failed", out + err)

    def test_tasks_of_a_node_share_its_relay(self):
        out_dir = self.out_dir()
        proc = self.pyxis_srun(["-N2", "--ntasks-per-node=2"], ["--log-level", "debug"],
                               ["python3", self.probe, out_dir])
        code, out, err, seconds = self.finish(proc, 90)
        self.assertEqual(code, 0, out + err)
        records = self.probe_records(out_dir, 4)
        self.assertEqual({r["env"]["LOCAL_WORLD_SIZE"] for r in records.values()}, {"2"})
        self.assertNotIn("joining the server directly", err)
        # One relay a node, in the /tmp that the node's containers share, both tasks beside it.
        for r in records.values():
            node = r["env"]["SLURMD_NODENAME"]
            self.assertEqual([os.path.basename(s) for s in r["relays"]],
                             [f"relay-slurm-{r['env']['SLURM_JOB_ID']}.0-{node}.sock"], r)

    def test_without_munges_socket_the_agent_names_the_mount(self):
        # An rdzvd off this host (an address no host has: nothing is sent), and no /run/munge.
        proc = self.pyxis_srun(["-N1"], [], ["true"],
                               mounts=[f"{CONTAINER_DIR}:/opt/rdzv:ro", f"{self.tmp}:{self.tmp}"],
                               env=self.env(RDZV_ENDPOINT="192.0.2.1:29400"))
        code, out, err, seconds = self.finish(proc, 60)
        self.assertEqual(code, 1, out + err)
        self.assertLess(seconds, 20, err)
        self.assertRegex(err, r"cannot prove who this process is to the rendezvous server at "
                         r"192\.0\.2\.1:29400: no MUNGE socket at /run/munge/munge\.socket\.2 "
                         r"\(inside a container, mount the host's /run/munge: pyxis "
                         r"--container-mounts=/run/munge:/run/munge")

    def test_a_node_name_that_resolves_nowhere_inside_names_rdzv_endpoint(self):
        proc = self.pyxis_srun(["-N2"], [], ["true"],
                               env=self.env(RDZV_TEST_HOSTS_FILE="/etc/hosts"))
        code, out, err, _ = self.finish(proc, 60)
        self.assertEqual(code, 1, out + err)
        lines = [l for l in err.splitlines() if "cannot resolve the rendezvous host" in l]
        self.assertEqual(len(lines), 2, err)
        for line in lines:
            self.assertIn("pass --rdzv-endpoint ADDRESS:PORT", line)


class AgentOutsideTest(ContainerCase):
    """The host's agent, each worker in a container of its own."""

    def test_apptainer_template_trains_with_the_images_torch(self):
        code, _, output = self.sbatch(
            os.path.join(TEMPLATES, "ddp-apptainer.sbatch"),
            ["--nodes=2", "--gpus-per-node=2", "--cpus-per-task=1"], ["--steps", "5"],
            env=self.env(IMAGE=IMAGE, RDZV_AGENT=AGENT, PYTHON="python3",
                         TRAIN_SCRIPT=self.script_path),
            timeout=300)
        self.assertEqual(code, 0, output)
        self.assert_trained_in_image(output, nodes=2, nproc=2)

    def test_apptainer_watchdog_error_file_and_stop_cross_the_boundary(self):
        def start(out_dir, actions):
            return self.start_srun(
                ["-N2"], ["apptainer", "exec", "--nv", IMAGE, "python3", self.probe, out_dir,
                          *actions], env=self.env(),
                agent_args=["--nproc-per-node", "2", "--hang-timeout", "auto"])
        self.check_boundary(start)

    def test_enroot_template_trains_with_the_images_torch(self):
        code, _, output = self.sbatch(
            os.path.join(TEMPLATES, "ddp-enroot.sbatch"),
            ["--nodes=2", "--gpus-per-node=2", "--cpus-per-task=1"], ["--steps", "5"],
            env=self.env(IMAGE=IMAGE, RDZV_AGENT=AGENT, PYTHON="python3",
                         TRAIN_SCRIPT=self.script_path, ENROOT_CONF=ENROOT_CONF),
            timeout=300)
        self.assertEqual(code, 0, output)
        self.assert_trained_in_image(output, nodes=2, nproc=2)

    def test_enroot_watchdog_error_file_and_stop_cross_the_boundary(self):
        def start(out_dir, actions):
            return self.start_srun(
                ["-N2"], ["enroot", "start", "--conf", ENROOT_CONF, "--mount",
                          f"{self.tmp}:{self.tmp}", IMAGE, "python3", self.probe, out_dir,
                          *actions], env=self.env(),
                agent_args=["--nproc-per-node", "2", "--hang-timeout", "auto"])
        records = self.check_boundary(start)
        # enroot starts from an empty environment: only the configuration passed these in.
        for r in records.values():
            self.assertIn("SLURM_JOB_ID", r["env"])
            self.assertNotIn("ENROOT_CONF", r["env"])


if __name__ == "__main__":
    unittest.main()
