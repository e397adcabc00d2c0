#!/usr/bin/env python3
"""The launch shapes users write by hand, with rdzv-agent in place of the torch launcher, under
the local Slurm cluster (deploy/slurm/local-cluster.sh, with its fake GPUs as GRES): workers that
read Slurm's variables, scripts that parse --local_rank, the GPU views of per-node and per-task
steps, and one srun step per node forming one job. Runs like test_slurm.py (same inputs)."""
import os
import sys
import textwrap
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

    def test_one_gpu_per_task(self):
        # What --gpus-per-task=1 gives each task (that needs select/cons_tres; the cluster runs
        # select/linear): the step's GPUs in SLURM_STEP_GPUS, the task's own one in
        # CUDA_VISIBLE_DEVICES.
        out_dir = self.out_dir()
        argv = ["srun", f"--job-name={self.job_name}", "-N1", "-n4", "--gpus-per-node=4",
                "bash", "-c", 'CUDA_VISIBLE_DEVICES=$SLURM_LOCALID exec "$@"', "task",
                test_slurm.AGENT, "--", sys.executable, self.reader, out_dir]
        code, out, err, _ = self.finish(self.start(argv, test_slurm.base_env()), 120)
        self.assertEqual(code, 0, f"stdout:\n{out}\nstderr:\n{err}")
        records = self.records(out_dir, 4)
        # Each worker's device LOCAL_RANK is its task's own GPU.
        self.assertEqual(sorted((int(r["env"]["LOCAL_RANK"]), r["device"]) for r in records),
                         [(0, "0"), (1, "1"), (2, "2"), (3, "3")])


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
