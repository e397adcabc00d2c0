#!/usr/bin/env python3
"""Random faults against real jobs on loopback: each round starts a real rdzvd and a job of real
rdzv-agents whose workers send heartbeats (--hang-timeout), then does one fault picked at random:
SIGKILL to a worker, to an agent or to rdzvd, SIGSTOP to a worker (which hangs the job until its
agent's watchdog finds it), SIGSTOP to an agent or to rdzvd (SIGCONT once the others are done),
or SIGKILL to an agent that still waits for the rest of its job.

In a flat job with a hot spare (--spare-nodes 1, --max-restarts 1, a fourth agent), SIGKILL goes
to an agent that runs ranks, or to the spare: the spare takes a lost node's place and the healed
job completes; a lost spare changes nothing until another fault restarts the job without it.

Each fault is done in a flat job (every agent on its own stream to rdzvd) and in a tree: a Slurm
step (its environment, without Slurm) on 127.0.0.1-3 with --fan-in 2, where nodes 0 and 1 join
through the relay node 0's agent hosts, and node 2 joins directly. There the faults to an agent
hit the relay's: a relay that dies or freezes is a lost node like any other.

Each round checks what a user would: every agent exits within the bound its flags state, with a
non-zero code and a line on stderr that says why the job failed; afterwards none of the round's
processes is left and no agent's run directory is left.

The seed is printed; CHAOS_SEED=N reruns the same faults, CHAOS_ROUNDS=N changes their number.
Inputs (ctest sets them): RDZVD_BIN, RDZV_AGENT_BIN.
"""
import ctypes
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

RDZVD = os.environ.get("RDZVD_BIN", "")
AGENT = os.environ.get("RDZV_AGENT_BIN", "")

NODES = 3
NPROC = 2
# The bounds the flags below set.
SERVER_KEEPALIVE_S = 0.3  # rdzvd --ping-ms and --keepalive-timeout-ms: a lost (stopped) agent
RECONNECT_S = 1.0         # rdzv-agent --reconnect-timeout: a lost rdzvd
JOIN_S = 3.0              # rdzv-agent --join-timeout of a job that never fills
TERM_S = 1.0              # rdzv-agent --term-timeout: SIGTERM to SIGKILL of the workers
HANG_S = 2.0              # rdzv-agent --hang-timeout: a worker without heartbeats for this long
HEARTBEAT_S = 0.2         # how often the workers send one
# A hung worker's stack: the other agents wait for it up to the term timeout and 2 s more.
STACK_WAIT_S = TERM_S + 2.0
# The agent's own pings to rdzvd (5 s apart, 20 s for the answer): how long a frozen rdzvd,
# whose connections stay open, takes to be noticed. No flag sets them.
CLIENT_KEEPALIVE_S = 25.0
# A tree's relay pings its members (1 s, 1 s for the answer), and they it: a member or relay that
# freezes is noticed after both.
RELAY_PING_S = 2.0
# In a tree, node FAN_IN (the second group's first and only node) joins directly.
FAN_IN = 2
# Room for a loaded machine (two cores shared with builds) on every bound.
SLACK_S = 5.0

# kill-joining-agent: SIGKILL to an agent that waits for a job that never fills.
FAULTS = ("kill-worker", "stop-worker", "kill-agent", "kill-rdzvd", "stop-agent",
          "kill-joining-agent", "stop-rdzvd")
# stop-rdzvd waits out the agents' keepalive: it is done once per kind of job, the others at
# random.
CHEAP_FAULTS = FAULTS[:-1]
# Faults to a flat job with one hot spare, each done once.
SPARE_FAULTS = ("kill-agent-spared", "kill-spare")

# A heartbeat to the agent's watchdog FIFO, as rdzv's heartbeat() writes it. The first is sent
# before the worker counts as started: only a worker that has sent one can be found hung.
HEARTBEAT = ('echo "{\\"version\\": 1, \\"pid\\": $$, \\"heartbeat\\": true}" '
             '> "$TORCHELASTIC_TIMER_FILE"')
WORKER = (HEARTBEAT + ' && echo $$ > "$CHAOS_PIDS/$RANK.tmp" && '
          'mv "$CHAOS_PIDS/$RANK.tmp" "$CHAOS_PIDS/$RANK" && '
          'while sleep %g; do %s; done' % (HEARTBEAT_S, HEARTBEAT))
# In a job with a spare, a restarted worker notes where it runs and is done: the healed job ends.
HEALED_WORKER = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ]; then '
                 'echo "$GROUP_RANK $TEST_NODE" > "$CHAOS_PIDS/healed-$RANK"; exit 0; fi; ' + WORKER)


def die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RDZV_"))}
    env["RDZV_CONFIG"] = os.devnull
    env.update(extra)
    return env


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def process_alive(pid):
    """True while `pid` exists and is no zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def processes_of_round(marker, sessions):
    """Live processes (pid -> command line) that carry `marker` in their environment or run in
    one of `sessions`: whatever a round started, at any depth."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            in_session = int(fields[3]) in sessions  # state, ppid, pgrp, session
            with open("/proc/%d/environ" % pid, "rb") as f:
                marked = marker.encode() in f.read().split(b"\0")
            if in_session or marked:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    found[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return found


def wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


class Round:
    """One job: rdzvd, NODES agents and their workers, all under a directory of its own that is
    also the agents' TMPDIR (their run directories go there)."""

    def __init__(self, number, tree=False):
        self.job = "chaos-%d" % number
        self.tree = tree
        self.dir = tempfile.mkdtemp(prefix="rdzv-chaos-%d-" % number)
        self.tmp = os.path.join(self.dir, "tmp")
        self.pids = os.path.join(self.dir, "pids")
        os.mkdir(self.tmp)
        os.mkdir(self.pids)
        self.marker = "RDZV_CHAOS_ROUND=%s" % self.dir
        self.env = clean_env(TMPDIR=self.tmp, CHAOS_PIDS=self.pids,
                             RDZV_CHAOS_ROUND=self.dir)
        # A Slurm job id of the round's own: a tree's relay ports derive from the job.
        self.slurm_job = 9000000 + random.SystemRandom().randrange(1000000)
        self.rdzvd = None
        self.agents = []
        self.sessions = set()

    def start(self, nodes=NODES, join_timeout_s=30, spares=0):
        """rdzvd, and the agents of the first `nodes` of the job's NODES nodes; with `spares`,
        that many more agents, the job's hot spares."""
        log = os.path.join(self.dir, "rdzvd.err")
        with open(log, "wb") as err:
            self.rdzvd = subprocess.Popen(
                [RDZVD, "--auth", "none", "--listen", "127.0.0.1:0",
                 "--keepalive-ms", str(int(SERVER_KEEPALIVE_S * 1000)),
                 "--ping-ms", str(int(SERVER_KEEPALIVE_S * 1000)),
                 "--keepalive-timeout-ms", str(int(SERVER_KEEPALIVE_S * 1000)),
                 "--progress-interval-ms", "200"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=self.env,
                start_new_session=True, preexec_fn=die_with_parent)
        self.sessions.add(self.rdzvd.pid)
        port = wait_until(lambda: re.search(r"serving on .* \(port (\d+)\)", read_text(log)) or
                          self.rdzvd.poll() is not None, 30)
        if not isinstance(port, re.Match):
            raise AssertionError("rdzvd did not start: %s" % read_text(log))
        endpoint = "127.0.0.1:%s" % port.group(1)
        for node in range(nodes + spares):
            argv = [AGENT, "--auth", "none", "--rdzv-endpoint", endpoint, "--rdzv-id", self.job,
                    "--host-name", "n%d" % node, "--nproc-per-node", str(NPROC),
                    "--join-timeout", "%gs" % join_timeout_s,
                    "--reconnect-timeout", "%gs" % RECONNECT_S,
                    "--term-timeout", "%gs" % TERM_S, "--hang-timeout", "%gs" % HANG_S]
            env = dict(self.env)
            if self.tree:
                # Node n of a per-node step on 127.0.0.<n+1>: the relay listens on its node's
                # address, found in the step's node list.
                argv += ["--fan-in", str(FAN_IN)]
                env.update(SLURM_JOB_ID=str(self.slurm_job), SLURM_STEP_ID="0",
                           SLURM_PROCID=str(node), SLURM_NODEID=str(node), SLURM_LOCALID="0",
                           SLURM_STEP_NUM_NODES=str(NODES), SLURM_STEP_NUM_TASKS=str(NODES),
                           SLURM_STEP_TASKS_PER_NODE="1(x%d)" % NODES,
                           SLURM_STEP_NODELIST="127.0.0.[1-%d]" % NODES,
                           SLURMD_NODENAME="127.0.0.%d" % (node + 1))
            elif spares:
                argv += ["--nnodes", str(NODES + spares), "--node-rank", str(node),
                         "--spare-nodes", str(spares), "--max-restarts", "1"]
                env["TEST_NODE"] = "n%d" % node
            else:
                argv += ["--nnodes", str(NODES), "--node-rank", str(node)]
            out = open(os.path.join(self.dir, "agent-%d.out" % node), "wb")
            err = open(os.path.join(self.dir, "agent-%d.err" % node), "wb")
            with out, err:
                agent = subprocess.Popen(
                    argv + ["--", "/bin/sh", "-c", HEALED_WORKER if spares else WORKER],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                    start_new_session=True, preexec_fn=die_with_parent)
            self.agents.append(agent)
            self.sessions.add(agent.pid)

    def worker_pids(self):
        """rank -> pid of the workers that have started."""
        pids = {}
        for name in os.listdir(self.pids):
            if name.isdigit():
                pids[int(name)] = int(read_text(os.path.join(self.pids, name)))
        return pids

    def healed(self):
        """rank -> "GROUP_RANK host" of the restarted workers of a job with spares."""
        return {int(name[len("healed-"):]): read_text(os.path.join(self.pids, name)).strip()
                for name in os.listdir(self.pids) if name.startswith("healed-")}

    def stderr(self, node):
        return read_text(os.path.join(self.dir, "agent-%d.err" % node))

    def run_dirs(self):
        return sorted(os.listdir(self.tmp))

    def describe(self):
        text = ["rdzvd: %s" % read_text(os.path.join(self.dir, "rdzvd.err"))]
        for node in range(len(self.agents)):
            text.append("agent %d (exit %s):\n%s" % (node, self.agents[node].returncode,
                                                     self.stderr(node)))
        return "\n".join(text)

    def stop_everything(self):
        """SIGCONT and SIGKILL to every process the round started, and wait for them."""
        for pid in list(processes_of_round(self.marker, self.sessions)):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        for process in self.agents + ([self.rdzvd] if self.rdzvd else []):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


class ChaosTest(unittest.TestCase):

    def test_random_faults(self):
        for binary in (RDZVD, AGENT):
            self.assertTrue(binary and os.access(binary, os.X_OK),
                            "RDZVD_BIN=%r / RDZV_AGENT_BIN=%r: build rdzvd and rdzv-agent and "
                            "set them (ctest does)" % (RDZVD, AGENT))
        seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
        rounds = int(os.environ.get("CHAOS_ROUNDS") or 16)
        rng = random.Random(seed)
        # Every fault in a flat job and in a tree, then faults at random.
        faults = [(f, tree) for tree in (False, True) for f in FAULTS]
        faults += [(f, False) for f in SPARE_FAULTS]
        faults += [(rng.choice(CHEAP_FAULTS), rng.random() < 0.5)
                   for _ in range(rounds - len(faults))]
        rng.shuffle(faults)
        names = ["%s%s" % (f, " (tree)" if tree else "") for f, tree in faults]
        print("chaos seed %d (rerun with CHAOS_SEED=%d): %s" % (seed, seed, ", ".join(names)),
              flush=True)
        started = time.monotonic()
        for number, (fault, tree) in enumerate(faults):
            with self.subTest(round=number, fault=fault, tree=tree, seed=seed):
                round_started = time.monotonic()
                self.run_round(number, fault, tree, rng)
                print("round %d: %s in %.1f s" % (number, names[number],
                                                  time.monotonic() - round_started), flush=True)
        print("%d rounds in %.1f s" % (len(faults), time.monotonic() - started), flush=True)

    def run_round(self, number, fault, tree, rng):
        r = Round(number, tree)
        try:
            if fault == "kill-joining-agent":
                self.kill_joining_agent(r, rng)
                return
            if fault in SPARE_FAULTS:
                self.kill_with_a_spare(r, fault, rng)
                return
            r.start()
            running = wait_until(lambda: len(r.worker_pids()) == NODES * NPROC, 30)
            self.assertTrue(running, "the job did not start its workers\n" + r.describe())
            workers = r.worker_pids()
            # In a tree, the relay's node: its member (node 1) loses its way to the server.
            node = 0 if tree else rng.randrange(NODES)
            others = [n for n in range(NODES) if n != node]
            # How long a frozen agent takes to be noticed: by rdzvd's pings, or in a tree by the
            # relay's (a member) or its members' (the relay).
            frozen_s = RELAY_PING_S if tree else SERVER_KEEPALIVE_S * 2

            if fault == "kill-worker":
                rank = rng.randrange(NODES * NPROC)
                os.kill(workers[rank], signal.SIGKILL)
                self.expect_failed(r, range(NODES), TERM_S,
                                   r"rank %d \(.*\) on n\d was killed by SIGKILL" % rank)
            elif fault == "stop-worker":
                # Its heartbeats stop: found after the hang timeout (and a 100 ms check), sent
                # SIGABRT, which waits while it is stopped, and SIGKILL after the term timeout; the
                # others wait for its (empty) stack.
                rank = rng.randrange(NODES * NPROC)
                os.kill(workers[rank], signal.SIGSTOP)
                self.expect_failed(r, range(NODES), HANG_S + 0.1 + STACK_WAIT_S,
                                   r"failed: rank %d hung: no heartbeat for [0-9.]+s "
                                   r"\(timeout 2s\)" % rank)
            elif fault == "kill-agent":
                r.agents[node].send_signal(signal.SIGKILL)
                self.expect_failed(r, others, SERVER_KEEPALIVE_S * 2 + TERM_S,
                                   "lost contact with the agent on n%d" % node)
                self.assertEqual(r.agents[node].wait(timeout=5), -signal.SIGKILL)
            elif fault == "kill-rdzvd":
                r.rdzvd.send_signal(signal.SIGKILL)
                self.expect_failed(r, range(NODES), RECONNECT_S + TERM_S,
                                   "lost the rendezvous server at .* could not rejoin within 1s")
            elif fault == "stop-agent":
                r.agents[node].send_signal(signal.SIGSTOP)
                self.expect_failed(r, others, frozen_s + TERM_S,
                                   "lost contact with the agent on n%d" % node)
                # Woken, it learns that the job ended without it.
                r.agents[node].send_signal(signal.SIGCONT)
                self.expect_failed(r, [node], RECONNECT_S + TERM_S,
                                   "lost contact with the agent on n%d" % node)
            elif fault == "stop-rdzvd":
                r.rdzvd.send_signal(signal.SIGSTOP)
                self.expect_failed(r, range(NODES), CLIENT_KEEPALIVE_S + RECONNECT_S + TERM_S,
                                   "lost the rendezvous server at .* could not rejoin within 1s")
                r.rdzvd.send_signal(signal.SIGCONT)

            self.expect_nothing_left(r, workers)
        finally:
            r.stop_everything()

    def kill_joining_agent(self, r, rng):
        """All but one node's agents join a job that never fills; one of them is killed while it
        waits, and the others give up at their --join-timeout."""
        r.start(nodes=NODES - 1, join_timeout_s=JOIN_S)
        waiting = wait_until(lambda: all("waiting for 1 of %d nodes" % NODES in r.stderr(n)
                                         for n in range(NODES - 1)), 30)
        self.assertTrue(waiting, "the agents did not join\n" + r.describe())
        node = 0 if r.tree else rng.randrange(NODES - 1)
        r.agents[node].send_signal(signal.SIGKILL)
        self.assertEqual(r.agents[node].wait(timeout=5), -signal.SIGKILL)
        self.expect_failed(r, [n for n in range(NODES - 1) if n != node], JOIN_S + TERM_S,
                           "the rendezvous did not complete within 3s")
        self.expect_nothing_left(r, {})

    def kill_with_a_spare(self, r, fault, rng):
        """NODES nodes and a spare (node NODES). kill-agent-spared: SIGKILL to a node's agent;
        the spare takes its node rank and ranks, the others keep theirs, and the healed job
        completes. kill-spare: SIGKILL to the spare, which costs the job nothing; then a worker
        is killed, and the job restarts on its own nodes and completes."""
        r.start(spares=1)
        running = wait_until(lambda: len(r.worker_pids()) == NODES * NPROC and
                             "n%d is a spare" % NODES in r.stderr(NODES), 30)
        self.assertTrue(running, "the job did not start with its spare\n" + r.describe())
        workers = r.worker_pids()
        if fault == "kill-agent-spared":
            lost = rng.randrange(NODES)
            r.agents[lost].send_signal(signal.SIGKILL)
            self.assertEqual(r.agents[lost].wait(timeout=5), -signal.SIGKILL)
            expect = {node: node for node in range(NODES)}
            expect[lost] = NODES
            survivors = [n for n in range(NODES + 1) if n != lost]
        else:
            r.agents[NODES].send_signal(signal.SIGKILL)
            self.assertEqual(r.agents[NODES].wait(timeout=5), -signal.SIGKILL)
            time.sleep(SERVER_KEEPALIVE_S * 2)
            self.assertIsNone(r.agents[0].poll(), "a lost spare ended the job\n" + r.describe())
            os.kill(workers[rng.randrange(NODES * NPROC)], signal.SIGKILL)
            expect = {node: node for node in range(NODES)}
            survivors = list(range(NODES))
        limit = SERVER_KEEPALIVE_S * 2 + TERM_S + SLACK_S
        for node in survivors:
            try:
                code = r.agents[node].wait(timeout=limit)
            except subprocess.TimeoutExpired:
                code = None
            self.assertEqual(code, 0, "agent %d\n%s" % (node, r.describe()))
        # Every rank ran again, each on the node that holds its node rank now.
        want = {rank: "%d n%d" % (rank // NPROC, expect[rank // NPROC])
                for rank in range(NODES * NPROC)}
        self.assertEqual(r.healed(), want, r.describe())
        self.expect_nothing_left(r, workers)

    def expect_nothing_left(self, r, workers):
        """rdzvd, where it still runs, has come through and stops cleanly; nothing of the job is
        left: no process (a killed agent's workers go with it, by their guards) and no run
        directory (a killed agent's guards remove it; before it has workers it has none)."""
        if r.rdzvd.poll() is None:
            r.rdzvd.send_signal(signal.SIGTERM)
            self.assertEqual(r.rdzvd.wait(timeout=20), 0, r.describe())
        left = wait_until(lambda: not processes_of_round(r.marker, r.sessions), 10)
        self.assertTrue(left, "processes left: %s" % processes_of_round(r.marker, r.sessions))
        for rank, pid in workers.items():
            self.assertFalse(process_alive(pid), "worker of rank %d is left" % rank)
        wait_until(lambda: not r.run_dirs(), 5)
        self.assertEqual(r.run_dirs(), [], "run directories left in %s" % r.tmp)

    def expect_failed(self, r, nodes, bound_s, cause):
        """The agents of `nodes` exit within bound_s (plus slack for a loaded machine) with a
        non-zero code, each with one error line on stderr about the job that says why (`cause`,
        a regular expression)."""
        limit = bound_s + SLACK_S
        deadline = time.monotonic() + limit
        for node in nodes:
            agent = r.agents[node]
            try:
                code = agent.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            if code is None:
                self.fail("agent %d still runs %.1f s after the fault (bound %.1f s + %.0f s)\n%s"
                          % (node, limit, bound_s, SLACK_S, r.describe()))
            self.assertNotEqual(code, 0, "agent %d\n%s" % (node, r.describe()))
            lines = [line for line in r.stderr(node).splitlines()
                     if re.match(r"rdzv-agent E \S+ job %s[: ]" % r.job, line)]
            self.assertEqual(len(lines), 1, "agent %d\n%s" % (node, r.describe()))
            self.assertRegex(lines[0], cause, "agent %d\n%s" % (node, r.describe()))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    unittest.main()
