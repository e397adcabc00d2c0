#!/usr/bin/env python3
"""The launch shapes users write by hand, with rdzv-agent in place of the torch launcher, under
the local Slurm cluster (deploy/slurm/local-cluster.sh, with its fake GPUs as GRES): workers that
read Slurm's variables, scripts that parse --local_rank, the GPU views of per-node and per-task
steps, and one srun step per node forming one job. Runs like test_slurm.py (same inputs).

GpusPerTaskTest starts a second local cluster with select/cons_tres, which --gpus-per-task
needs (the main one runs select/linear), beside the main one: its state directory, ports and
job ids follow the main one's (RDZV_SLURM_DIR + "-tres", RDZV_SLURM_PORT_BASE + 1000,
RDZV_SLURM_FIRST_JOB_ID + 100000), and it is stopped again when the class ends, even when it
fails."""
import os
import re
import subprocess
import sys
import textwrap
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_slurm  # noqa: E402
from test_slurm import SlurmTestCase, setUpModule  # noqa: E402,F401

# Takes its rank from Slurm the way submitit's and Lightning's Slurm environments do, and writes
# what it found next to what the agent said.
SLURM_READER = textwrap.dedent("""\
    import argparse, json, os, sys
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--local_rank", type=int, default=None)
    args = parser.parse_args()
    e = os.environ
    record = {
        "global_rank": int(e["SLURM_PROCID"]), "local_rank": int(e["SLURM_LOCALID"]),
        "node_rank": int(e["SLURM_NODEID"]), "world_size": int(e["SLURM_NTASKS"]),
        "arg_local_rank": args.local_rank, "env": dict(e)}
    # What torch.cuda.set_device(LOCAL_RANK) would pick, in this worker's device view.
    devices = [d for d in e.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    local = int(e["LOCAL_RANK"])
    record["device"] = devices[local] if local < len(devices) else None
    name = "worker-%s-%d.json" % (e["RANK"], os.getpid())
    with open(os.path.join(args.out_dir, name), "w") as f:
        json.dump(record, f)
""")


class LaunchShapeTest(SlurmTestCase):
    def setUp(self):
        super().setUp()
        self.reader = os.path.join(self.tmp, "reader.py")
        with open(self.reader, "w") as f:
            f.write(SLURM_READER)

    def run_readers(self, srun_args, agent_args=(), expected=4, command_args=(), env=None):
        out_dir = self.out_dir()
        out, err = self.srun(srun_args, [sys.executable, self.reader, out_dir, *command_args],
                             agent_args=agent_args, env=env)
        return self.records(out_dir, expected), err


class PerNodeSlurmVariablesTest(LaunchShapeTest):
    def test_workers_see_slurm_tasks_matching_their_ranks(self):
        records, err = self.run_readers(["-N2", "--ntasks-per-node=1"],
                                        ["--nproc-per-node", "2"])
        table = sorted((r["global_rank"], r["local_rank"], r["node_rank"], r["world_size"],
                        int(r["env"]["RANK"]), int(r["env"]["LOCAL_RANK"]),
                        int(r["env"]["GROUP_RANK"])) for r in records)
        self.assertEqual(table, [(0, 0, 0, 4, 0, 0, 0), (1, 1, 0, 4, 1, 1, 0),
                                 (2, 0, 1, 4, 2, 0, 1), (3, 1, 1, 4, 3, 1, 1)])
        for r in records:
            e = r["env"]
            self.assertEqual(e["SLURM_NPROCS"], "4")
            self.assertEqual(e["SLURM_NTASKS_PER_NODE"], "2")
            self.assertEqual(e["SLURM_TASKS_PER_NODE"], "2(x2)")
            self.assertEqual(e["SLURM_STEP_TASKS_PER_NODE"], "2(x2)")
            self.assertEqual(e["SLURM_STEP_NUM_TASKS"], "4")
            self.assertEqual(e["SLURM_NNODES"], "2")
        # Logged once per agent.
        self.assertEqual(err.count("workers see Slurm task variables"), 2, err)

    def test_keep_leaves_the_agents_variables(self):
        records, err = self.run_readers(["-N2", "--ntasks-per-node=1"],
                                        ["--nproc-per-node", "2", "--slurm-env", "keep"])
        self.assertEqual(sorted(r["global_rank"] for r in records), [0, 0, 1, 1])
        self.assertEqual({r["world_size"] for r in records}, {2})
        self.assertNotIn("workers see Slurm task variables", err)


class PassLocalRankTest(LaunchShapeTest):
    def test_scripts_that_parse_local_rank(self):
        records, _ = self.run_readers(["-N1", "--ntasks-per-node=1"],
                                      ["--nproc-per-node", "3", "--pass-local-rank"], expected=3)
        self.assertEqual(sorted((r["arg_local_rank"], int(r["env"]["LOCAL_RANK"]))
                                for r in records), [(0, 0), (1, 1), (2, 2)])


class GresTest(LaunchShapeTest):
    def test_workers_per_node_from_the_gpus_slurm_gives(self):
        # No --nproc-per-node: two workers per node, one per GPU of SLURM_GPUS_ON_NODE.
        records, _ = self.run_readers(["-N2", "--ntasks-per-node=1", "--gpus-per-node=2"])
        for r in records:
            self.assertEqual(r["env"]["SLURM_GPUS_ON_NODE"], "2")
            self.assertEqual(r["env"]["LOCAL_WORLD_SIZE"], "2")
        # set_device(LOCAL_RANK) picks a distinct GPU of the node for each worker.
        per_node = {}
        for r in records:
            self.assertIsNotNone(r["device"], r["env"].get("CUDA_VISIBLE_DEVICES"))
            per_node.setdefault(r["node_rank"], set()).add(r["device"])
        self.assertEqual(per_node, {0: {"0", "1"}, 1: {"0", "1"}})


# srun runs this before the agent, in each task: it writes what Slurm gave the task (its GPU in
# CUDA_VISIBLE_DEVICES, the step's in SLURM_STEP_GPUS), then becomes the agent, which sees the
# same environment.
GIVEN_RECORDER = textwrap.dedent("""\
    #!/bin/bash
    given="$1"; shift
    printf '%s %s %s %s\\n' "$SLURM_PROCID" "$SLURM_LOCALID" "$CUDA_VISIBLE_DEVICES" \\
        "$SLURM_STEP_GPUS" > "$given/task-$SLURM_PROCID"
    exec "$@"
""")


def tres_cluster_env():
    """local-cluster.sh's variables for the cons_tres cluster, derived from the main one's."""
    port = int(os.environ.get("RDZV_SLURM_PORT_BASE") or 16817) + 1000
    first_job = int(os.environ.get("RDZV_SLURM_FIRST_JOB_ID") or 1) + 100000
    directory = (os.environ.get("RDZV_SLURM_DIR") or "/tmp/rdzv-slurm").rstrip("/") + "-tres"
    return {"RDZV_SLURM_DIR": directory, "RDZV_SLURM_PORT_BASE": str(port),
            "RDZV_SLURM_FIRST_JOB_ID": str(first_job), "RDZV_SLURM_SELECT": "cons_tres"}


class GpusPerTaskTest(LaunchShapeTest):
    """The README's per-task line, `srun --ntasks-per-node=4 --gpus-per-task=1 rdzv-agent`, under
    a cluster that takes --gpus-per-task (select/cons_tres), with 4 fake GPUs per node."""

    tres_conf = None

    @classmethod
    def setUpClass(cls):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RDZV_SLURM"))}
        env.update(tres_cluster_env())
        cls.cluster_env = env
        # Registered first: it runs even when the start below fails half-way.
        cls.addClassCleanup(cls.stop_cluster)
        started = time.monotonic()
        start = subprocess.run([test_slurm.LOCAL_CLUSTER, "start"], env=env, capture_output=True,
                               text=True, timeout=300)
        if start.returncode != 0:
            raise RuntimeError(f"the cons_tres cluster did not start:\n{start.stderr}")
        cls.start_seconds = time.monotonic() - started
        out = subprocess.run([test_slurm.LOCAL_CLUSTER, "env"], env=env, capture_output=True,
                             text=True, timeout=30).stdout
        cls.tres_conf = re.search(r"^export SLURM_CONF=(.+)$", out, re.M).group(1)
        print(f"\ncons_tres cluster up in {cls.start_seconds:.1f}s ({env['RDZV_SLURM_DIR']})",
              file=sys.stderr)

    @classmethod
    def stop_cluster(cls):
        stop = subprocess.run([test_slurm.LOCAL_CLUSTER, "stop"], env=cls.cluster_env,
                              capture_output=True, text=True, timeout=180)
        if stop.returncode != 0:
            raise RuntimeError(f"the cons_tres cluster did not stop:\n{stop.stderr}")

    def setUp(self):
        super().setUp()
        self.recorder = os.path.join(self.tmp, "given.sh")
        with open(self.recorder, "w") as f:
            f.write(GIVEN_RECORDER)
        os.chmod(self.recorder, 0o755)
        self.given = self.out_dir("given")

    def tres_env(self):
        return test_slurm.base_env(SLURM_CONF=self.tres_conf)

    def stop_all(self):
        # The jobs of this class run on the second cluster: cancel them there too.
        subprocess.run(["scancel", "--name", self.job_name], env=self.tres_env(),
                       capture_output=True, timeout=30)
        super().stop_all()

    def run_per_task(self, srun_args, command):
        argv = ["srun", f"--job-name={self.job_name}", *srun_args, *command]
        code, out, err, _ = self.finish(self.start(argv, self.tres_env()), 120)
        self.assertEqual(code, 0, f"stdout:\n{out}\nstderr:\n{err}")
        return out, err

    def given_devices(self):
        """What Slurm gave each task: {SLURM_PROCID: (SLURM_LOCALID, its GPU, the step's)}."""
        given = {}
        for name in os.listdir(self.given):
            with open(os.path.join(self.given, name)) as f:
                proc_id, local_id, own, step = f.read().split()
            given[int(proc_id)] = (int(local_id), own, step.split(","))
        return given

    def check_views(self, nodes):
        out_dir = self.out_dir()
        _, err = self.run_per_task(
            [f"-N{nodes}", "--ntasks-per-node=4", "--gpus-per-task=1"],
            [self.recorder, self.given, test_slurm.AGENT, "--", sys.executable, self.reader,
             out_dir])
        records = self.records(out_dir, 4 * nodes)
        given = self.given_devices()
        self.assertEqual(len(given), 4 * nodes, given)
        # Slurm shows each task one GPU (in SLURM_STEP_GPUS too, which it binds per task), a
        # different one for each task of a node.
        node_gpus = {}
        for r in records:
            _, own, _ = given[int(r["env"]["SLURM_PROCID"])]
            node_gpus.setdefault(r["env"]["SLURM_NODEID"], set()).add(own)
        self.assertEqual({n: len(g) for n, g in node_gpus.items()},
                         {str(n): 4 for n in range(nodes)}, given)
        for r in records:
            e = r["env"]
            local_rank, own, _ = given[int(e["SLURM_PROCID"])]
            # Per-task mode: the agent is the task, and its worker keeps Slurm's place.
            self.assertEqual(int(e["LOCAL_RANK"]), local_rank)
            self.assertEqual(int(e["RANK"]), int(e["SLURM_PROCID"]))
            # The worker sees its node's GPUs of the step, and device LOCAL_RANK (what
            # torch.cuda.set_device(LOCAL_RANK) picks) is the task's own. Local rank 0 needs no
            # wider view: device 0 is its own.
            view = e["CUDA_VISIBLE_DEVICES"].split(",")
            if local_rank == 0:
                self.assertEqual(view, [own])
            else:
                self.assertEqual(sorted(view), sorted(node_gpus[e["SLURM_NODEID"]]), view)
            self.assertEqual(view[local_rank], own)
            self.assertEqual(r["device"], own)
        self.assertNotIn("set_device(LOCAL_RANK) fails", err)
        # The tasks' shared directories are gone with them.
        tmp = os.environ.get("TMPDIR") or "/tmp"
        self.assertEqual([n for n in os.listdir(tmp) if n.startswith(
            f"rdzv-gpus-{records[0]['env']['SLURM_JOB_ID']}.")], [])

    def test_one_node_four_tasks(self):
        self.check_views(1)

    def test_two_nodes_four_tasks_each(self):
        self.check_views(2)

    def test_renumbered_gpu_warns_before_the_worker_starts(self):
        # Where Slurm confines each task with cgroups it renumbers the task's GPU to 0. This
        # cluster has no cgroups, so the step shows every task its GPU as 0, as such a cluster
        # would; the agent's stderr goes to its stdout so that the two keep their order.
        reader = os.path.join(self.tmp, "announcing_reader.py")
        with open(reader, "w") as f:
            f.write('import os\nprint("worker LOCAL_RANK=%s starts" % os.environ["LOCAL_RANK"], '
                    'flush=True)\n' + SLURM_READER)
        out_dir = self.out_dir()
        out, _ = self.run_per_task(
            ["-N1", "--ntasks-per-node=4", "--gpus-per-task=1", "--label"],
            ["bash", "-c", 'CUDA_VISIBLE_DEVICES=0 exec "$@" 2>&1', "renumbered",
             test_slurm.AGENT, "--", sys.executable, reader, out_dir])
        records = self.records(out_dir, 4)
        self.assertEqual({r["env"]["CUDA_VISIBLE_DEVICES"] for r in records}, {"0"})
        for task in range(4):
            lines = [line.split(": ", 1)[1] for line in out.splitlines()
                     if line.split(": ", 1)[0].strip() == str(task)]
            starts = [i for i, line in enumerate(lines) if f"LOCAL_RANK={task} starts" in line]
            self.assertEqual(len(starts), 1, "\n".join(lines))
            warnings = [i for i, line in enumerate(lines) if "set_device(LOCAL_RANK) fails" in line]
            if task == 0:
                # Device 0 is right for local rank 0.
                self.assertEqual(warnings, [], "\n".join(lines))
                continue
            self.assertEqual(len(warnings), 1, "\n".join(lines))
            warning = lines[warnings[0]]
            self.assertRegex(warning, r"^rdzv-agent W ")
            self.assertIn(f"CUDA_VISIBLE_DEVICES=0) but LOCAL_RANK={task}", warning)
            self.assertIn("torch.cuda.set_device(0)", warning)
            self.assertIn("srun --ntasks-per-node=1 --gpus-per-node=N rdzv-agent", warning)
            self.assertLess(warnings[0], starts[0], "\n".join(lines))


# The seeds' loop of one srun step per node, with rdzv-agent in place of the torch launcher. The
# steps start seconds apart and the first node's, which hosts the rendezvous, comes last.
STEP_LOOP = textwrap.dedent("""\
    #!/bin/bash
    agent="$1"; nnodes="$2"; shift 2
    nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
    pids=()
    for i in $(seq $((SLURM_NNODES - 1)) -1 0); do
      srun -N1 -n1 -w "${nodes[$i]}" "$agent" --nnodes "$nnodes" --node-rank "$i" "$@" &
      pids+=($!)
      sleep 2
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    exit $rc
""")


class StepPerNodeTest(LaunchShapeTest):
    def run_loop(self, nnodes, agent_args):
        script = os.path.join(self.tmp, "steps.sh")
        with open(script, "w") as f:
            f.write(STEP_LOOP)
        out_dir = self.out_dir()
        code, job_id, output = self.sbatch(
            script, ["--nodes=3"],
            [test_slurm.AGENT, str(nnodes), *agent_args, "--", sys.executable, self.reader,
             out_dir], timeout=180)
        return code, job_id, output, out_dir

    def test_steps_started_apart_form_one_job(self):
        code, job_id, output, out_dir = self.run_loop(3, ["--nproc-per-node", "2"])
        self.assertEqual(code, 0, output)
        records = self.records(out_dir, 6)
        envs = [r["env"] for r in records]
        # Three steps, one rendezvous, one master for all six ranks.
        self.assertEqual(len({e["SLURM_STEP_ID"] for e in envs}), 3, output)
        self.assertEqual({e["TORCHELASTIC_RUN_ID"] for e in envs}, {f"slurm-{job_id}"})
        self.assertEqual(len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}), 1)
        # Node i of the loop (started with --node-rank i on the allocation's node i) runs ranks
        # 2i and 2i+1, and its workers' Slurm variables agree.
        table = sorted((int(e["RANK"]), int(e["LOCAL_RANK"]), int(e["GROUP_RANK"]),
                        int(e["WORLD_SIZE"]), e["SLURMD_NODENAME"], r["global_rank"],
                        r["local_rank"], r["node_rank"], r["world_size"], e["SLURM_NODELIST"])
                       for r, e in zip(records, envs))
        self.assertEqual(table, [(rank, rank % 2, rank // 2, 6, f"n{rank // 2 + 1}", rank,
                                  rank % 2, rank // 2, 6, "n[1-3]") for rank in range(6)])
        self.assertEqual(output.count("one step per node"), 3, output)

    def test_a_count_that_is_neither_step_nor_allocation_is_refused(self):
        code, _, output, out_dir = self.run_loop(2, [])
        self.assertNotEqual(code, 0, output)
        self.assertIn("--nnodes 2:2 matches neither the Slurm step, which runs 1 node, nor the "
                      "allocation's 3 nodes", output)
        self.assertEqual(os.listdir(out_dir), [])


if __name__ == "__main__":
    unittest.main()
