#!/usr/bin/env python3
"""Per-task launches through each node's relay, and per-node launches in groups (--fan-in), under
the local Slurm cluster and a head-node rdzvd: the tasks of a node, or the nodes of a group,
reach rdzvd over one stream (rdzv_join_streams), with the ranks,
fail-fast and lost-node detection of tasks that join on their own, and rdzvctl's view of every
task. Runs like test_slurm.py (same inputs)."""
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_slurm  # noqa: E402
from test_slurm import SlurmTestCase, base_env, free_port, setUpModule  # noqa: E402,F401

# Writes its record (test_slurm's worker) once its hold is over; the rank named by
# RDZV_TEST_VICTIM instead kills its own agent (the worker's grandparent: the agent runs each
# worker under a guard process) with SIGKILL, or exits 3 with RDZV_TEST_MODE=fail.
VICTIM = textwrap.dedent("""\
    import os, signal, sys, time
    time.sleep(float(sys.argv[2]))
    if os.environ["RANK"] == os.environ.get("RDZV_TEST_VICTIM"):
        if os.environ.get("RDZV_TEST_MODE") == "fail":
            sys.exit(3)
        with open("/proc/%d/stat" % os.getppid()) as f:
            agent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(os.path.join(sys.argv[1], "killed"), "w") as f:
            f.write(str(time.time()))
        if os.environ.get("RDZV_TEST_MODE") == "freeze":
            # Frozen, then gone: srun waits for every task.
            os.kill(agent, signal.SIGSTOP)
            time.sleep(12)
        os.kill(agent, signal.SIGKILL)
    time.sleep(60)
""")


def scrape(port):
    """rdzvd's metrics as {name: value} for the unlabelled rdzv_* gauges."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(rdzv_\w+) (\S+)$", text, re.MULTILINE)}


class NodeRelayTest(SlurmTestCase):
    def setUp(self):
        super().setUp()
        self.victim = os.path.join(self.tmp, "victim.py")
        with open(self.victim, "w") as f:
            f.write(VICTIM)

    def start_rdzvd_with_metrics(self, extra=(), port=None, log_name="rdzvd.log"):
        port, metrics = port or free_port(), free_port()
        log = open(os.path.join(self.tmp, log_name), "w")
        self.addCleanup(log.close)
        proc = subprocess.Popen(
            [test_slurm.RDZVD, "--listen", f"127.0.0.1:{port}", "--metrics-listen",
             f"127.0.0.1:{metrics}", *extra], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, env=base_env(), start_new_session=True)
        self.procs.append(proc)

        def up():
            try:
                scrape(metrics)
                return True
            except OSError:
                self.assertIsNone(proc.poll(), "rdzvd exited")
                return False
        self.wait_for(up, 15, "rdzvd serving its metrics")
        return f"127.0.0.1:{port}", metrics

    def streams_while_running(self, relay, nodes=3, tasks_per_node=4):
        """Runs NODES x TASKS_PER_NODE tasks (--node-relay RELAY) that hold for a few seconds;
        returns rdzvd's join streams and attached agents once all have joined, and checks the
        workers' ranks."""
        endpoint, metrics = self.start_rdzvd_with_metrics()
        out_dir = self.out_dir()
        tasks = nodes * tasks_per_node
        proc = self.start_srun([f"-N{nodes}", f"--ntasks-per-node={tasks_per_node}"],
                               [sys.executable, self.worker, out_dir, "3"],
                               agent_args=["--rdzv-endpoint", endpoint, "--node-relay", relay])
        seen = {}

        def all_attached():
            seen.update(scrape(metrics))
            return seen.get("rdzv_agents_attached") == tasks
        self.wait_for(all_attached, 60, f"{tasks} agents attached to rdzvd")
        code, out, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, err)
        self.check_per_task(self.records(out_dir, tasks), [tasks_per_node] * nodes)
        return seen["rdzv_join_streams"], seen["rdzv_agents_attached"]

    def test_tasks_of_a_node_share_one_stream(self):
        streams, agents = self.streams_while_running("on")
        self.assertEqual((streams, agents), (3, 12))

    def test_without_the_relay_each_task_holds_a_stream(self):
        streams, agents = self.streams_while_running("off")
        self.assertEqual((streams, agents), (12, 12))

    def per_node_streams_while_running(self, fan_in):
        """Runs 3 nodes, one agent each with 2 workers (--fan-in FAN_IN), that hold for a few
        seconds; returns rdzvd's join streams and attached agents once all have joined, and
        checks the workers' ranks."""
        endpoint, metrics = self.start_rdzvd_with_metrics()
        out_dir = self.out_dir()
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"],
                               [sys.executable, self.worker, out_dir, "3"],
                               agent_args=["--rdzv-endpoint", endpoint, "--nproc-per-node", "2",
                                           "--fan-in", str(fan_in)])
        seen = {}

        def all_attached():
            seen.update(scrape(metrics))
            return seen.get("rdzv_agents_attached") == 3
        self.wait_for(all_attached, 60, "3 agents attached to rdzvd")
        code, out, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, err)
        self.check_per_node(self.records(out_dir, 6), nodes=3, nproc=2)
        return seen["rdzv_join_streams"], seen["rdzv_agents_attached"]

    def test_nodes_in_groups_share_their_first_nodes_stream(self):
        # n1 relays n1 and n2; n3, a group of one, joins on its own.
        self.assertEqual(self.per_node_streams_while_running(2), (2, 3))

    def test_without_groups_each_node_holds_a_stream(self):
        self.assertEqual(self.per_node_streams_while_running(0), (3, 3))

    def test_cyclic_distribution_keeps_slurm_ranks(self):
        endpoint, _ = self.start_rdzvd_with_metrics()
        out_dir = self.out_dir()
        self.srun(["-N3", "-n6", "--distribution=cyclic"],
                  [sys.executable, self.worker, out_dir],
                  agent_args=["--rdzv-endpoint", endpoint])
        records = self.records(out_dir, 6)
        for r in records:
            e = r["env"]
            self.assertEqual(e["RANK"], e["SLURM_PROCID"])
            self.assertEqual(e["LOCAL_RANK"], e["SLURM_LOCALID"])
            self.assertEqual(e["GROUP_RANK"], e["SLURM_NODEID"])
            self.assertEqual(e["LOCAL_WORLD_SIZE"], "2")
        # Cyclic: node 0 runs tasks 0 and 3.
        self.assertEqual(sorted(int(r["env"]["RANK"]) for r in records
                                if r["env"]["SLURM_NODEID"] == "0"), [0, 3])

    def run_victim(self, rank, mode="kill"):
        """3 nodes x 4 tasks whose rank RANK kills its agent (or fails); returns srun's exit
        code, its stderr, and the seconds from the kill to srun's end (None for a failure)."""
        endpoint, _ = self.start_rdzvd_with_metrics()
        out_dir = self.out_dir()
        env = base_env(RDZV_TEST_VICTIM=rank, RDZV_TEST_MODE=mode)
        proc = self.start_srun(["-N3", "--ntasks-per-node=4"],
                               [sys.executable, self.victim, out_dir, "2"], env=env,
                               agent_args=["--rdzv-endpoint", endpoint])
        code, _, err, _ = self.finish(proc, 120)
        ended = time.time()
        killed = os.path.join(out_dir, "killed")
        took = None
        if os.path.exists(killed):
            with open(killed) as f:
                took = ended - float(f.read())
        return code, err, took

    def assert_every_agent_names(self, err, cause, agents):
        lines = [line for line in err.splitlines() if "failed: " in line and " E " in line]
        self.assertEqual(len(lines), agents, err)
        for line in lines:
            self.assertIn(cause, line)

    def test_a_tasks_agent_killed_ends_the_job_naming_it(self):
        # Rank 5: node 1's second task, which joins through node 1's relay.
        code, err, took = self.run_victim("5")
        self.assertNotEqual(code, 0)
        self.assert_every_agent_names(
            err, "lost contact with the agent on n2 (node 1, ranks 5-5)", 11)
        self.assertIsNotNone(took)
        # srun itself takes a moment to end the step; the agents heard it in milliseconds.
        self.assertLess(took, 10, err)

    def test_the_relays_agent_killed_ends_the_job_naming_its_node(self):
        # Rank 4: node 1's first task, which hosts the node's relay.
        code, err, took = self.run_victim("4")
        self.assertNotEqual(code, 0)
        self.assert_every_agent_names(
            err, "lost contact with the agent on n2 (node 1, ranks 4-4)", 11)
        self.assertIsNotNone(took)
        self.assertLess(took, 10, err)

    def test_a_frozen_relay_does_not_hold_its_nodes_tasks(self):
        # Rank 4 stops (SIGSTOP) node 1's relay agent for 12 s, then kills it. rdzvd's pings (1 s
        # apart here) find it lost; node 1's other tasks find their relay silent and ask rdzvd
        # how the job ended, long before the relay is killed.
        endpoint, _ = self.start_rdzvd_with_metrics(extra=["--ping-ms", "1000"])
        out_dir = self.out_dir()
        env = base_env(RDZV_TEST_VICTIM="4", RDZV_TEST_MODE="freeze")
        proc = self.start_srun(["-N3", "--ntasks-per-node=4"],
                               [sys.executable, self.victim, out_dir, "2"], env=env,
                               agent_args=["--rdzv-endpoint", endpoint])
        code, _, err, _ = self.finish(proc, 120)
        self.assertNotEqual(code, 0)
        with open(os.path.join(out_dir, "killed")) as f:
            frozen = float(f.read())
        ended = []
        for line in err.splitlines():
            m = re.match(r"rdzv-agent E (\d+):(\d+):(\d+\.\d+) job \S+ failed: ", line)
            if m:
                self.assertIn("lost contact with the agent on n2 (node 1", line)
                ended.append(int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)))
        self.assertEqual(len(ended), 11, err)
        day = time.localtime(frozen)  # the agents log local time
        frozen_of_day = day.tm_hour * 3600 + day.tm_min * 60 + day.tm_sec + frozen % 1
        # Every other agent, node 1's three included, ended well before the relay was killed.
        print(f"frozen relay: the last agent ended {max(ended) - frozen_of_day:.2f} s after it froze",
              file=sys.stderr)
        self.assertLess(max(ended) - frozen_of_day, 8, err)

    def test_a_failing_rank_stops_every_task(self):
        code, err, _ = self.run_victim("6", mode="fail")
        self.assertEqual(code, 3, err)
        self.assert_every_agent_names(
            err, "rank 6 (local rank 2, node 1) on n2 exited with code 3", 12)

    def test_a_restart_rejoins_through_the_relays(self):
        endpoint, metrics = self.start_rdzvd_with_metrics()
        marker = os.path.join(self.tmp, "failed-once")
        script = (f"if [ $RANK = 6 ] && [ ! -e {marker} ]; then touch {marker}; exit 3; fi; "
                  "sleep 3; echo rank $RANK restart $TORCHELASTIC_RESTART_COUNT")
        proc = self.start_srun(["-N3", "--ntasks-per-node=4"], ["bash", "-c", script],
                               agent_args=["--rdzv-endpoint", endpoint, "--max-restarts", "1"])

        def second_round_running():
            m = scrape(metrics)
            return m.get("rdzv_restarts_total") == 1 and m.get("rdzv_agents_attached") == 12
        self.wait_for(second_round_running, 60, "the restarted round running")
        # The first round's group streams go: one per node again.
        seen = []
        deadline = time.monotonic() + 5
        while not seen or seen[-1] != 3:
            self.assertLess(time.monotonic(), deadline,
                            f"one join stream per node in the restarted round: saw {seen}")
            seen.append(scrape(metrics)["rdzv_join_streams"])
            time.sleep(0.1)
        code, out, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(re.findall(r"rank (\d+) restart 1", out), key=int),
                         [str(r) for r in range(12)], out)

    def test_relays_take_their_nodes_tasks_to_the_backup(self):
        """A primary rdzvd killed while a per-task job runs: each node's relay moves its tasks to
        the backup, still over one stream per node, and the workers run on untouched."""
        a_port, b_port = free_port(), free_port()
        primary, a_metrics = self.start_rdzvd_with_metrics(
            ["--peers", f"127.0.0.1:{b_port}"], port=a_port)
        primary_proc = self.procs[-1]
        backup, b_metrics = self.start_rdzvd_with_metrics(
            ["--peers", f"127.0.0.1:{a_port}"], port=b_port, log_name="rdzvd-backup.log")
        go, up = os.path.join(self.tmp, "go"), self.out_dir("up")
        script = (f"touch {up}/$RANK; while [ ! -e {go} ]; do sleep 0.1; done; "
                  "echo rank $RANK restart $TORCHELASTIC_RESTART_COUNT")
        proc = self.start_srun(["-N3", "--ntasks-per-node=4"], ["bash", "-c", script],
                               agent_args=["--rdzv-endpoint", f"{primary},{backup}",
                                           "--failover-timeout", "1s"])
        # Running: every worker started.
        self.wait_for(lambda: len(os.listdir(up)) == 12, 60, "the 12 workers started")
        self.assertEqual(scrape(a_metrics).get("rdzv_agents_attached"), 12)
        primary_proc.kill()
        primary_proc.wait()
        seen = {}

        def on_the_backup():
            seen.update(scrape(b_metrics))
            return seen.get("rdzv_agents_attached") == 12
        try:
            self.wait_for(on_the_backup, 60, "the 12 tasks attached to the backup")
        except AssertionError as e:
            self.stop_all()
            _, err = proc.communicate(timeout=30)
            with open(os.path.join(self.tmp, "rdzvd-backup.log")) as f:
                raise AssertionError(f"{e}; saw {seen}\nsrun:\n{err}\nbackup:\n{f.read()}")
        self.assertEqual(seen["rdzv_failovers_total"], 1)
        self.assertEqual(seen["rdzv_join_streams"], 3, "one stream per node, through its relay")
        with open(go, "w"):
            pass
        code, out, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(re.findall(r"rank (\d+) restart 0", out), key=int),
                         [str(r) for r in range(12)], out)

    def test_rdzvctl_lists_every_task(self):
        endpoint, metrics = self.start_rdzvd_with_metrics()
        out_dir = self.out_dir()
        proc = self.start_srun(["-N2", "--ntasks-per-node=3"],
                               [sys.executable, self.worker, out_dir, "4"],
                               agent_args=["--rdzv-endpoint", endpoint])
        self.wait_for(lambda: scrape(metrics).get("rdzv_agents_attached") == 6, 60,
                      "6 agents attached")
        status = subprocess.run([test_slurm.RDZVCTL, "--rdzv-endpoint", endpoint, "status",
                                 "--all", "--json"], capture_output=True, text=True,
                                env=base_env(), timeout=30)
        self.assertEqual(status.returncode, 0, status.stderr)
        code, _, err, _ = self.finish(proc, 120)
        self.assertEqual(code, 0, err)
        jobs = json.loads(status.stdout)["jobs"]
        self.assertEqual(len(jobs), 1, status.stdout)
        agents = jobs[0]["agents"]
        self.assertEqual(len(agents), 6, status.stdout)
        self.assertEqual(sorted(a["rank_offset"] for a in agents), list(range(6)))


if __name__ == "__main__":
    unittest.main()
