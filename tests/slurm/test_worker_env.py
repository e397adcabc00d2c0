#!/usr/bin/env python3
"""Every worker's Slurm and MPI variables against its ranks, in every launch shape, under the
local Slurm cluster (deploy/slurm/local-cluster.sh): per-node with uneven worker counts,
per-task, one srun step per node, --standalone under srun, sbatch and salloc, restarts, and
srun --mpi=pmi2. Each worker must see what srun would give it as a task of one step with the
job's real layout, or nothing where no consistent value exists, and none of the agent's own place
in its launcher (PMI_*, PMIX_*, OMPI_COMM_WORLD_*, the PMI socket) unless it is the launcher's
task. Runs like test_slurm.py (same inputs)."""
import json
import os
import sys
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_slurm  # noqa: E402
from test_slurm import SlurmTestCase, base_env, setUpModule  # noqa: E402,F401

# Writes its environment, its pid and its open descriptors. With --fail-first-rank R, rank R of
# the first attempt fails before writing, so that the job restarts, and the other ranks of that
# attempt wait until the restart stops them.
PLACE_READER = textwrap.dedent("""\
    import argparse, json, os, time
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--fail-first-rank", type=int, default=None)
    args = parser.parse_args()
    e = os.environ
    if args.fail_first_rank is not None and e["TORCHELASTIC_RESTART_COUNT"] == "0":
        if args.fail_first_rank == int(e["RANK"]):
            raise SystemExit(3)
        # The others wait for the restart to stop them: a node whose workers all succeeded
        # first would have left the job, and the restart would wait for it.
        time.sleep(120)
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            pass  # the directory's own descriptor, closed by now
    record = {"env": dict(e), "pid": os.getpid(), "fds": fds}
    name = "worker-%s-%s-%d.json" % (e["TORCHELASTIC_RESTART_COUNT"], e["RANK"], os.getpid())
    tmp = os.path.join(args.out_dir, "." + name)
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, os.path.join(args.out_dir, name))
""")

# Under srun: gives the agent of node SLURM_NODEID the worker count at that place of $COUNTS.
PER_NODE_COUNT = textwrap.dedent("""\
    #!/bin/bash
    read -r -a counts <<< "$COUNTS"
    export RDZV_NPROC_PER_NODE="${counts[$SLURM_NODEID]}"
    exec "$@"
""")

# One srun step per node, node i running counts[i] workers.
STEP_PER_NODE = textwrap.dedent("""\
    #!/bin/bash
    agent="$1"; shift
    read -r -a counts <<< "$COUNTS"
    nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
    pids=()
    for i in $(seq 0 $((SLURM_NNODES - 1))); do
      RDZV_NPROC_PER_NODE="${counts[$i]}" srun -N1 -n1 -w "${nodes[$i]}" "$agent" \\
          --nnodes "$SLURM_NNODES" --node-rank "$i" "$@" &
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    exit $rc
""")

# --standalone in a batch script, as the agent's own hint suggests for one node.
STANDALONE_BATCH = textwrap.dedent("""\
    #!/bin/bash
    agent="$1"; shift
    exec "$agent" --standalone "$@"
""")

LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_COMM_WORLD_", "MPI_LOCALRANKID", "OMPI_UNIVERSE_SIZE")

# What srun gives (and so what the agents inherit) under mpirun or srun --mpi=pmix: the place of
# the agent, which its workers must not take for theirs. PMIx itself is not built into the local
# cluster's Slurm, so these come from the environment srun passes on.
FOREIGN_PLACE = {"PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.0.0", "OMPI_COMM_WORLD_RANK": "0",
                 "OMPI_COMM_WORLD_SIZE": "1", "OMPI_UNIVERSE_SIZE": "1", "MPI_LOCALRANKID": "0"}


def tasks_per_node(counts):
    """Slurm's compressed syntax: [2, 2, 1] -> "2(x2),1"."""
    parts = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(str(counts[i]) if j - i == 1 else "%d(x%d)" % (counts[i], j - i))
        i = j
    return ",".join(parts)


class WorkerEnvTest(SlurmTestCase):
    def setUp(self):
        super().setUp()
        self.reader = os.path.join(self.tmp, "place_reader.py")
        with open(self.reader, "w") as f:
            f.write(PLACE_READER)

    def script(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
        return path

    def reader_command(self, out_dir, *more):
        return [sys.executable, self.reader, out_dir, *more]

    def run_srun(self, srun_args, agent_args, env=None, wrapper=(), expected=None,
                 reader_args=()):
        out_dir = self.out_dir()
        argv = ["srun", f"--job-name={self.job_name}", *srun_args, *wrapper, test_slurm.AGENT,
                *agent_args, "--", *self.reader_command(out_dir, *reader_args)]
        proc = self.start(argv, env or base_env())
        code, out, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, f"{argv} failed\nstdout:\n{out}\nstderr:\n{err}")
        return self.read(out_dir, expected), err

    def read(self, out_dir, expected, restart="0"):
        records = [r for r in self.records_any(out_dir)
                   if r["env"]["TORCHELASTIC_RESTART_COUNT"] == restart]
        if expected is not None:
            self.assertEqual(len(records), expected, [r["env"]["RANK"] for r in records])
        return records

    def records_any(self, out_dir):
        out = []
        for n in sorted(os.listdir(out_dir)):
            if n.startswith("worker-"):
                with open(os.path.join(out_dir, n)) as f:
                    out.append(json.load(f))
        return out

    def check_places(self, records, counts, nodelist, launcher_hidden=True, sockets=False):
        """Every worker's Slurm variables are those of its ranks in a step of COUNTS workers per
        node on NODELIST (None: no node list; ALLOCATION: the nodes Slurm gave the job, whichever
        were free), SLURM_TASK_PID is its own pid, and with
        LAUNCHER_HIDDEN it sees no launcher place, nor (unless SOCKETS) any inherited socket
        such as the agent's PMI_FD."""
        world = sum(counts)
        self.assertEqual(sorted(int(r["env"]["RANK"]) for r in records), list(range(world)))
        even = len(set(counts)) == 1
        for r in records:
            e = r["env"]
            rank, local, node = int(e["RANK"]), int(e["LOCAL_RANK"]), int(e["GROUP_RANK"])
            first = sum(counts[:node])
            step_nodes = e.get("SLURM_JOB_NODELIST") if nodelist is ALLOCATION else nodelist
            where = f"rank {rank}: " + " ".join(f"{k}={v}" for k, v in sorted(e.items())
                                                if k.startswith(("SLURM_", "PMI")))
            self.assertEqual(rank, first + local, where)
            self.assertEqual(e["LOCAL_WORLD_SIZE"], str(counts[node]), where)
            self.assertEqual(e["GROUP_WORLD_SIZE"], str(len(counts)), where)
            got = {k: e.get(k) for k in (
                "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_GTIDS", "SLURM_NTASKS",
                "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS", "SLURM_TASKS_PER_NODE",
                "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES",
                "SLURM_STEP_NUM_NODES", "SLURM_NODELIST", "SLURM_STEP_NODELIST",
                "SLURM_TASK_PID")}
            want = {
                "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
                "SLURM_NODEID": str(node),
                "SLURM_GTIDS": ",".join(str(first + i) for i in range(counts[node])),
                "SLURM_NTASKS": str(world), "SLURM_NPROCS": str(world),
                "SLURM_STEP_NUM_TASKS": str(world),
                "SLURM_TASKS_PER_NODE": tasks_per_node(counts),
                "SLURM_STEP_TASKS_PER_NODE": tasks_per_node(counts),
                "SLURM_NTASKS_PER_NODE": str(counts[0]) if even else None,
                "SLURM_NNODES": str(len(counts)), "SLURM_STEP_NUM_NODES": str(len(counts)),
                "SLURM_NODELIST": step_nodes, "SLURM_STEP_NODELIST": step_nodes,
                "SLURM_TASK_PID": str(r["pid"])}
            self.assertEqual(got, want, where)
            if launcher_hidden:
                leaked = sorted(k for k in e if k.startswith(LAUNCHER_PREFIXES))
                self.assertEqual(leaked, [], where)
            if launcher_hidden and not sockets:
                inherited = {fd: t for fd, t in r["fds"].items()
                             if int(fd) > 2 and t.startswith("socket:")}
                self.assertEqual(inherited, {}, where)


# check_places' node list for a step over the whole of its job's allocation, which is whichever
# nodes were free: the job's own SLURM_JOB_NODELIST.
ALLOCATION = object()


class PerNodeTest(WorkerEnvTest):
    def test_uneven_nodes_under_pmi2(self):
        # Nodes running 2, 1 and 3 workers, under srun --mpi=pmi2 (PMI_RANK, PMI_SIZE and the
        # PMI_FD socket of each agent) with PMIx and Open MPI variables passed on by srun.
        wrapper = self.script("per_node_count.sh", PER_NODE_COUNT)
        records, err = self.run_srun(
            ["-N3", "--ntasks-per-node=1", "--mpi=pmi2"], [], wrapper=[wrapper], expected=6,
            env=base_env(COUNTS="2 1 3", **FOREIGN_PLACE))
        self.check_places(records, [2, 1, 3], ALLOCATION)
        self.assertEqual(err.count("workers do not see this agent's place"), 3, err)
        self.assertIn("PMI_FD", err)

    def test_mpi_env_keep_passes_the_agents_place_on(self):
        records, _ = self.run_srun(["-N2", "--ntasks-per-node=1", "--mpi=pmi2"],
                                   ["--nproc-per-node", "2", "--mpi-env", "keep"], expected=4)
        self.check_places(records, [2, 2], ALLOCATION, launcher_hidden=False)
        for r in records:
            e = r["env"]
            # The agent's place, as asked: its node index, shared by the node's workers.
            self.assertEqual(e["PMI_RANK"], e["GROUP_RANK"])
            self.assertEqual(e["PMI_SIZE"], "2")
            self.assertTrue(r["fds"].get(e["PMI_FD"], "").startswith("socket:"), r["fds"])

    def test_restarted_workers_see_the_new_round(self):
        out_dir = self.out_dir()
        argv = ["srun", f"--job-name={self.job_name}", "-N2", "--ntasks-per-node=1",
                test_slurm.AGENT, "--nproc-per-node", "2", "--max-restarts", "1", "--",
                *self.reader_command(out_dir, "--fail-first-rank", "1")]
        proc = self.start(argv, base_env())
        code, out, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, f"stdout:\n{out}\nstderr:\n{err}")
        self.check_places(self.read(out_dir, 4, restart="1"), [2, 2], ALLOCATION)

    def test_slurm_env_keep_warns_once_per_agent(self):
        records, err = self.run_srun(["-N2", "--ntasks-per-node=1"],
                                     ["--nproc-per-node", "2", "--slurm-env", "keep"],
                                     expected=4)
        self.assertEqual(sorted(r["env"]["SLURM_PROCID"] for r in records), ["0", "0", "1", "1"])
        warnings = [line for line in err.splitlines() if "--slurm-env keep:" in line]
        self.assertEqual(len(warnings), 2, err)
        self.assertIn("PyTorch Lightning", warnings[0])
        self.assertIn("duplicate ranks", warnings[0])


class PerTaskTest(WorkerEnvTest):
    def test_the_launchers_place_is_the_workers_own(self):
        records, err = self.run_srun(["-N2", "-n3", "--mpi=pmi2"], [], expected=3)
        self.check_places(records, [2, 1], ALLOCATION, launcher_hidden=False)
        for r in records:
            e = r["env"]
            self.assertEqual(e["PMI_RANK"], e["RANK"])
            self.assertEqual(e["PMI_SIZE"], "3")
            self.assertTrue(r["fds"].get(e["PMI_FD"], "").startswith("socket:"), r["fds"])
        self.assertNotIn("workers do not see this agent's place", err)


class StepPerNodeTest(WorkerEnvTest):
    def test_uneven_steps_form_one_job(self):
        script = self.script("steps.sh", STEP_PER_NODE)
        out_dir = self.out_dir()
        code, job_id, output = self.sbatch(
            script, ["--nodes=3"],
            [test_slurm.AGENT, "--", *self.reader_command(out_dir)],
            env=base_env(COUNTS="1 3 2"), timeout=180)
        self.assertEqual(code, 0, output)
        records = self.read(out_dir, 6)
        self.check_places(records, [1, 3, 2], ALLOCATION)
        self.assertEqual({r["env"]["TORCHELASTIC_RUN_ID"] for r in records}, {f"slurm-{job_id}"})


class StandaloneTest(WorkerEnvTest):
    def check_standalone(self, records, node, sockets=False):
        self.check_places(records, [3], node, sockets=sockets)
        run_ids = {r["env"]["TORCHELASTIC_RUN_ID"] for r in records}
        self.assertEqual(len(run_ids), 1)
        self.assertTrue(run_ids.pop().startswith("standalone-"))

    def test_under_srun(self):
        records, _ = self.run_srun(["-N1", "-n1", "-w", "n2", "--mpi=pmi2"],
                                   ["--standalone", "--nproc-per-node", "3"], expected=3)
        self.check_standalone(records, "n2")

    def test_under_sbatch(self):
        # Two nodes allocated, one used: the batch step's SLURM_PROCID=0, SLURM_GTIDS=0 and
        # the allocation's node list are not the workers'.
        script = self.script("standalone.sh", STANDALONE_BATCH)
        out_dir = self.out_dir()
        code, _, output = self.sbatch(
            script, ["--nodes=2"],
            [test_slurm.AGENT, "--nproc-per-node", "3", "--", *self.reader_command(out_dir)],
            timeout=120)
        self.assertEqual(code, 0, output)
        records = self.read(out_dir, 3)
        node = records[0]["env"]["SLURMD_NODENAME"]
        self.check_standalone(records, node)
        # The job's two nodes (whichever were free), of which the workers' step uses one.
        self.assertEqual(len({r["env"]["SLURM_JOB_NODELIST"] for r in records}), 1)
        self.assertRegex(records[0]["env"]["SLURM_JOB_NODELIST"], r"^n\[[1-4][-,][1-4]\]$")

    def test_under_salloc(self):
        # salloc runs the agent here, in a shell that is on none of the nodes: no node list.
        # salloc leaves its command a socket of its own, which no variable names.
        out_dir = self.out_dir()
        argv = ["salloc", f"--job-name={self.job_name}", "-N1", test_slurm.AGENT, "--standalone",
                "--nproc-per-node", "3", "--", *self.reader_command(out_dir)]
        proc = self.start(argv, base_env())
        code, out, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, f"stdout:\n{out}\nstderr:\n{err}")
        records = self.read(out_dir, 3)
        self.check_standalone(records, None, sockets=True)
        self.assertTrue(all(r["env"].get("SLURM_JOB_ID") for r in records))


if __name__ == "__main__":
    unittest.main()
