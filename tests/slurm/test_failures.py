#!/usr/bin/env python3
"""Failures and signals under a real Slurm: the local 3-node cluster of
deploy/slurm/local-cluster.sh.

What a user does and checks when a job goes wrong or is told to stop: a worker that crashes,
an agent that is killed, scancel of a job, a user signal sent with scancel, and the
checkpoint-and-requeue template (deploy/slurm/ddp-requeue.sbatch). Every test asserts the exit
code, how soon the job ended, what the output says, and that no process of the job is left.

Inputs and conventions are those of test_slurm.py (whose helpers this suite reuses): ctest sets
RDZV_AGENT_BIN, RDZVD_BIN, RDZV_SOURCE_DIR and RDZV_TORCH_PYTHON, and the cluster must be up
(ctest's slurm_cluster fixture starts it).

  sudo deploy/slurm/local-cluster.sh start
  RDZV_AGENT_BIN=build/client/agent/rdzv-agent RDZVD_BIN=build/server/rdzvd \\
      /usr/bin/python3 tests/slurm/test_failures.py -v
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_slurm  # noqa: E402  (the shared setup, environment and cleanup)
from test_slurm import AGENT, SOURCE_DIR, SlurmTestCase, base_env, marked_pids  # noqa: E402

REQUEUE_TEMPLATE = os.path.join(SOURCE_DIR, "deploy", "slurm", "ddp-requeue.sbatch")
CHECKPOINT_DEMO = os.path.join(SOURCE_DIR, "deploy", "examples", "checkpoint_demo.py")

# How soon a job must be over once it has failed or been cancelled: the agents stop their
# workers with SIGTERM (SIGKILL 3 s later), and Slurm's KillWait on the local cluster is 5 s.
PROMPT = 20


def setUpModule():
    test_slurm.setUpModule()


def describe(pids):
    lines = []
    for p in pids:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                lines.append(f"{p}: " + f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return "; ".join(lines)


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class FailureCase(SlurmTestCase):
    """SlurmTestCase with a marker in every process's environment and ways to wait on things."""

    def setUp(self):
        self.marker = uuid.uuid4().hex
        # Registered first, so it runs last: after the base class has cancelled the job.
        self.addCleanup(self.assert_nothing_left, 10)
        super().setUp()

    def env(self, **extra):
        return base_env(RDZV_TEST_MARKER=self.marker, **extra)

    def assert_nothing_left(self, timeout):
        """No process of the job (agent, guard, worker, its children) within TIMEOUT seconds."""
        deadline = time.monotonic() + timeout
        while marked_pids(self.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = marked_pids(self.marker)
        self.assertEqual(left, [], "left running: " + describe(left))

    def job_id(self, timeout=30):
        """The Slurm job id of this test's job, once squeue lists it."""
        found = []

        def listed():
            out = subprocess.run(["squeue", "-h", "--name", self.job_name, "-o", "%A"],
                                 env=base_env(), capture_output=True, text=True, timeout=30)
            found[:] = out.stdout.split()
            return bool(found)

        self.wait_for(listed, timeout, f"squeue never listed job {self.job_name}")
        return found[0]

    def job_state(self, job_id):
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], env=base_env(),
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def ready_count(self, out_dir):
        return len([n for n in os.listdir(out_dir) if n.startswith("ready-")])

    def scancel(self, *args):
        done = subprocess.run(["scancel", *args], env=base_env(), capture_output=True,
                              text=True, timeout=30)
        self.assertEqual(done.returncode, 0, f"scancel {shlex.join(args)}: {done.stderr}")

    def agent_pid_on(self, node):
        """The rdzv-agent task on NODE: among this job's processes that run the agent binary
        (its guards are forks of it), the one whose parent is not one of them."""
        agent = os.path.realpath(AGENT)
        candidates = {}
        for pid in marked_pids(self.marker):
            try:
                if os.path.realpath(f"/proc/{pid}/exe") != agent:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"SLURMD_NODENAME={node}".encode() not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{pid}/stat") as f:
                    candidates[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
        agents = [pid for pid, parent in candidates.items() if parent not in candidates]
        self.assertEqual(len(agents), 1, f"agents on {node}: {describe(candidates)}")
        return agents[0]


class WorkerFailureTest(FailureCase):

    def test_segv_rank_stops_every_node(self):
        out_dir = self.out_dir()
        script = (f'touch {out_dir}/ready-$RANK; '
                  'if [ "$RANK" = 4 ]; then sleep 1; ulimit -c 0; kill -SEGV $$; fi; '
                  'sleep 60; echo "rank $RANK was not stopped"')
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"], ["/bin/sh", "-c", script],
                               env=self.env(), agent_args=["--nproc-per-node", "2"])
        code, out, err, seconds = self.finish(proc, 90)
        output = out + err
        self.assertEqual(code, 139, output)
        self.assertEqual(self.ready_count(out_dir), 6, output)
        self.assertLess(seconds, PROMPT, f"srun took {seconds:.1f}s to return\n{output}")
        # Every agent prints the root cause: rank 4 is node 2's (n3's) first worker.
        causes = re.findall(r"job slurm-\d+\.0 failed: (.*)", output)
        self.assertEqual(len(causes), 3, output)
        for cause in causes:
            self.assertEqual(cause, "rank 4 (local rank 0, node 2) on n3 was killed by SIGSEGV "
                             "(exit code 139)")
        self.assertNotIn("was not stopped", output)
        self.assert_nothing_left(5)


class FinishedNodeTest(FailureCase):

    def test_a_restart_that_needs_a_finished_node_ends_at_once(self):
        """--max-restarts 1: node 0's rank succeeds at once and its agent is done; rank 1 then
        crashes. Its restart would need node 0 back, which is gone: the job ends within seconds
        with the rank's code, not at --join-timeout (60 s here, 10 minutes by default), and the
        last line names the failure and the node that had finished. Node 0's agent hosts the
        job's server: it stays up, through node 1's restart, to tell it so."""
        out_dir = self.out_dir()
        script = (f'if [ "$RANK" = 0 ]; then touch {out_dir}/done-0; exit 0; fi; '
                  f'while [ ! -e {out_dir}/done-0 ]; do sleep 0.05; done; sleep 1; '
                  f'date +%s.%N > {out_dir}/failed-at; echo "rank 1: Segmentation fault" >&2; '
                  'exit 3')
        proc = self.start_srun(["-N2", "--ntasks-per-node=1"], ["/bin/sh", "-c", script],
                               env=self.env(), agent_args=["--max-restarts", "1", "--join-timeout", "60s"])
        code, out, err, seconds = self.finish(proc, 90)
        ended = time.time()
        output = out + err
        self.assertEqual(code, 3, output)
        failed_at = float(read_text(os.path.join(out_dir, "failed-at")) or "nan")
        since = ended - failed_at
        print(f"\nfrom rank 1's failure to srun's return: {since:.3f}s", flush=True)
        self.assertLess(since, PROMPT, f"the restart waited for the node that finished\n{output}")
        causes = re.findall(r"job slurm-\d+\.0 failed: (.*)", output)
        self.assertEqual(len(causes), 1, output)  # node 0's agent had succeeded and says so
        self.assertIn("rank 1 (local rank 0, node 1) on n2 exited with code 3", causes[0])
        self.assertIn("n1 (node 0) had already finished", causes[0])
        self.assertIn("rank 1: Segmentation fault", output)
        self.assertNotIn("waiting for 1 of 2 nodes", output)
        self.assert_nothing_left(5)


class LostAgentTest(FailureCase):

    def test_sigkill_of_one_agent_ends_the_job(self):
        out_dir = self.out_dir()
        script = f'touch {out_dir}/ready-$RANK; sleep 60; echo "rank $RANK was not stopped"'
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"], ["/bin/sh", "-c", script],
                               env=self.env(), agent_args=["--nproc-per-node", "2"])
        self.wait_for(lambda: self.ready_count(out_dir) == 6, 60, "six workers")
        os.kill(self.agent_pid_on("n2"), signal.SIGKILL)
        code, out, err, seconds = self.finish(proc, 90)
        output = out + err
        self.assertNotEqual(code, 0, output)
        self.assertLess(seconds, PROMPT, f"srun took {seconds:.1f}s to return\n{output}")
        # The two agents left say which one they lost.
        self.assertEqual(len(re.findall(r"failed: lost contact with the agent on n2\b", output)),
                         2, output)
        self.assertNotIn("was not stopped", output)
        self.assert_nothing_left(5)


class HealthCheckTest(FailureCase):

    def left_out(self, bad, ran):
        """--nnodes 2:3 with BAD's check failing: the job forms from the nodes RAN at once (not
        after --last-call) and completes; BAD's agent exits 83 with the check's line."""
        out_dir = self.out_dir()
        check = (f'if [ "$SLURMD_NODENAME" = {bad} ]; then echo "/scratch is read-only on {bad}"; '
                 'exit 1; fi')
        script = f'touch {out_dir}/ready-$RANK; echo "rank $RANK of $WORLD_SIZE on $SLURMD_NODENAME"'
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"], ["/bin/sh", "-c", script],
                               env=self.env(),
                               agent_args=["--nnodes", "2:3", "--last-call", "120s",
                                           "--health-check", check])
        code, out, err, seconds = self.finish(proc, 90)
        output = out + err
        # srun returns the highest exit code of its tasks: the left-out node's.
        self.assertEqual(code, 83, output)
        self.assertLess(seconds, 60, f"the job waited for --last-call\n{output}")
        self.assertEqual(sorted(os.listdir(out_dir)), ["ready-0", "ready-1"], output)
        self.assertIn(f"rank 0 of 2 on {ran[0]}", output)
        self.assertIn(f"rank 1 of 2 on {ran[1]}", output)
        self.assertRegex(output, f"this node is left out of the job: {bad}: health check failed: "
                                 f"/scratch is read-only on {bad} \\(exit code 1\\)")
        # The nodes that ran say which node was left out, and why.
        self.assertEqual(len(re.findall(f"{bad} is left out of the job: {bad} \\(node \\d\\): "
                                        "health check failed: /scratch is read-only", output)),
                         2, output)
        self.assert_nothing_left(5)

    def test_a_node_that_fails_its_health_check_is_left_out(self):
        self.left_out("n2", ["n1", "n3"])

    def test_the_first_node_hosts_the_rendezvous_even_when_it_is_left_out(self):
        # n1's agent hosts the job's server: it stays up until n2 and n3 have run and gone.
        self.left_out("n1", ["n2", "n3"])


class RankRequestTest(FailureCase):

    def asked_out(self, bad, ran):
        """BAD's rank finds its node bad, says so on the watchdog FIFO and fails: the job restarts
        at once on the nodes RAN and completes; BAD's agent exits 83."""
        out_dir = self.out_dir()
        script = (
            'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then '
            f'  if [ "$SLURMD_NODENAME" = {bad} ]; then '
            '    printf \'{"version": 1, "pid": %d, "exclude_node": "ECC errors on GPU 0"}\\n\' $$ '
            '      > "$TORCHELASTIC_TIMER_FILE"; exit 1; fi; '
            '  exec sleep 60; fi; '
            f'touch {out_dir}/ready-$RANK; echo "rank $RANK of $WORLD_SIZE on $SLURMD_NODENAME"')
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"], ["/bin/sh", "-c", script],
                               env=self.env(),
                               agent_args=["--nnodes", "2:3", "--last-call", "120s",
                                           "--max-restarts", "1"])
        code, out, err, seconds = self.finish(proc, 90)
        output = out + err
        self.assertEqual(code, 83, output)
        self.assertLess(seconds, 60, f"the restart waited for --last-call\n{output}")
        self.assertEqual(sorted(os.listdir(out_dir)), ["ready-0", "ready-1"], output)
        self.assertIn(f"rank 0 of 2 on {ran[0]}", output)
        self.assertIn(f"rank 1 of 2 on {ran[1]}", output)
        self.assertRegex(output, f"this node is left out of the job: {bad}: a rank asked for it: "
                                 "rank \\d: ECC errors on GPU 0")
        self.assertEqual(len(re.findall(f"{bad} is left out of the job: {bad} \\(node \\d\\): a "
                                        "rank asked for it: rank \\d: ECC errors on GPU 0",
                                        output)),
                         2, output)
        self.assert_nothing_left(5)

    def test_a_rank_asks_for_its_node_to_be_left_out(self):
        self.asked_out("n2", ["n1", "n3"])

    def test_the_first_node_may_be_asked_out_though_it_hosts_the_rendezvous(self):
        self.asked_out("n1", ["n2", "n3"])

    def test_a_rank_that_exits_84_ends_the_job_despite_its_restarts(self):
        script = 'if [ "$RANK" = 1 ]; then echo "no dataset in the config" >&2; exit 84; fi; exec sleep 60'
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"], ["/bin/sh", "-c", script],
                               env=self.env(), agent_args=["--max-restarts", "3"])
        code, out, err, seconds = self.finish(proc, 90)
        output = out + err
        self.assertEqual(code, 84, output)
        self.assertLess(seconds, 30, output)
        self.assertIn("exited with code 84; it asked that the job not restart", output)
        self.assertNotIn("restarting the workers", output)
        self.assert_nothing_left(5)


class SpareTest(FailureCase):

    def test_a_spare_takes_the_place_of_a_node_whose_agent_is_killed(self):
        """srun -N4 with --spare-nodes 1: n1-n3 run ranks 0-5 and n4 waits; n2's agent is
        killed with SIGKILL, and the job restarts at once with n4 as node 1 (ranks 2-3) while
        n1 and n3 keep theirs; it completes there."""
        out_dir = self.out_dir()
        script = (f'echo $SLURMD_NODENAME $GROUP_RANK > {out_dir}/run$TORCHELASTIC_RESTART_COUNT-$RANK; '
                  'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 60; fi; '
                  'echo "rank $RANK of $WORLD_SIZE on $SLURMD_NODENAME"')
        proc = self.start_srun(["-N4", "--ntasks-per-node=1"], ["/bin/sh", "-c", script],
                               env=self.env(),
                               agent_args=["--nproc-per-node", "2", "--spare-nodes", "1",
                                           "--max-restarts", "1"])

        def run(n):
            return {name.split("-")[1]: read_text(os.path.join(out_dir, name)).strip()
                    for name in os.listdir(out_dir) if name.startswith(f"run{n}-")}

        self.wait_for(lambda: len(run(0)) == 6, 60, "six workers")
        self.assertEqual(run(0), {"0": "n1 0", "1": "n1 0", "2": "n2 1", "3": "n2 1",
                                  "4": "n3 2", "5": "n3 2"})
        os.kill(self.agent_pid_on("n2"), signal.SIGKILL)
        code, out, err, seconds = self.finish(proc, 90)
        output = out + err
        # srun returns the killed task's status; the others succeed.
        self.assertNotEqual(code, 0, output)
        self.assertLess(seconds, PROMPT, f"srun took {seconds:.1f}s to return\n{output}")
        self.assertEqual(run(1), {"0": "n1 0", "1": "n1 0", "2": "n4 1", "3": "n4 1",
                                  "4": "n3 2", "5": "n3 2"}, output)
        self.assertIn("n4 is a spare", output)
        self.assertEqual(len(re.findall(r"restarting the workers \(restart 1 of 1\) after: lost "
                                        r"contact with the agent on n2\b", output)), 3, output)
        for rank in range(6):
            self.assertIn(f"rank {rank} of 6 on", output)
        # Each node that ran the healed job names the node it lost, for next time.
        self.assertEqual(len(re.findall(r"left out n2 \(node 1\): lost while the job ran; next "
                                        r"time: sbatch --exclude=n2", output)), 3, output)
        self.assert_nothing_left(5)


class CancelTest(FailureCase):

    def test_scancel_of_a_batch_job_leaves_nothing(self):
        out_dir = self.out_dir()
        script = os.path.join(self.tmp, "job.sbatch")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f"""\
                #!/bin/bash
                srun {shlex.quote(AGENT)} --nproc-per-node 2 -- \\
                    /bin/sh -c 'touch {out_dir}/ready-$RANK; sleep 60'
            """))
        submit = self.start(["sbatch", "--parsable", f"--job-name={self.job_name}",
                             f"--chdir={self.tmp}", f"--output={self.tmp}/slurm-%j.out",
                             "--nodes=3", "--ntasks-per-node=1", script], self.env())
        code, out, err, _ = self.finish(submit, 60)
        self.assertEqual(code, 0, err)
        job_id = out.strip().split(";")[0]
        self.wait_for(lambda: self.ready_count(out_dir) == 6, 60, "six workers")
        started = time.monotonic()
        self.scancel(job_id)
        self.assert_nothing_left(10)
        seconds = time.monotonic() - started
        self.assertLess(seconds, 10, f"the job's processes took {seconds:.1f}s to go")


# A worker that records the user signals it gets, then ends once it has seen SIGUSR1 (bash
# runs the trap between commands, so the short sleeps keep it responsive; the sleeps that the
# signal kills make bash print "User defined signal 1"; the loop counts in bash, as a `seq` would
# be killed too). It says it is ready only once its trap is set: before that, SIGUSR1 would kill
# it.
SIGNAL_WORKER = ("trap 'echo USR1 >> {out}/sig-$RANK' USR1; touch {out}/ready-$RANK; "
                 "i=0; while [ $((i += 1)) -le 600 ]; do [ -s {out}/sig-$RANK ] && exit 0; "
                 "sleep 0.05; done; "
                 "echo \"rank $RANK never got SIGUSR1\"; exit 9")


class UserSignalTest(FailureCase):

    def check_every_worker_got_usr1(self, out_dir, output):
        for rank in range(6):
            lines = read_text(os.path.join(out_dir, f"sig-{rank}")).split()
            self.assertGreaterEqual(lines.count("USR1"), 1, f"rank {rank}\n{output}")
            self.assertEqual(set(lines), {"USR1"}, f"rank {rank}\n{output}")
        # Slurm signals every process of the step itself, so a worker may get the signal
        # directly, handle it and end before its agent gets to forwarding it: what counts is
        # that each worker got it and no agent took it for a failure.
        self.assertLessEqual(len(re.findall(r"forwarded SIGUSR1 to [0-2] workers", output)), 3,
                             output)
        self.assertNotIn("never got SIGUSR1", output)
        self.assertNotIn("failed", output)

    def test_scancel_signal_reaches_every_worker_of_an_srun_job(self):
        out_dir = self.out_dir()
        proc = self.start_srun(["-N3", "--ntasks-per-node=1"],
                               ["bash", "-c", SIGNAL_WORKER.format(out=out_dir)],
                               env=self.env(), agent_args=["--nproc-per-node", "2"])
        self.wait_for(lambda: self.ready_count(out_dir) == 6, 60, "six workers")
        self.scancel("--signal=USR1", self.job_id())
        code, out, err, _ = self.finish(proc, 90)
        self.assertEqual(code, 0, out + err)
        self.check_every_worker_got_usr1(out_dir, out + err)

    def test_scancel_signal_reaches_the_steps_of_a_batch_job(self):
        # Without --batch or --full, scancel signals the job's steps only: the batch shell,
        # which does not handle SIGUSR1, is left alone and the job ends normally.
        out_dir = self.out_dir()
        script = os.path.join(self.tmp, "job.sbatch")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f"""\
                #!/bin/bash
                srun {shlex.quote(AGENT)} --nproc-per-node 2 -- \\
                    bash -c {shlex.quote(SIGNAL_WORKER.format(out=out_dir))}
                echo "srun exited $?"
            """))
        output_file = os.path.join(self.tmp, "slurm-%j.out")
        batch = self.start(["sbatch", "--wait", "--parsable", f"--job-name={self.job_name}",
                            f"--chdir={self.tmp}", f"--output={output_file}", "--nodes=3",
                            "--ntasks-per-node=1", script], self.env())
        self.wait_for(lambda: self.ready_count(out_dir) == 6, 60, "six workers")
        job_id = self.job_id()
        self.scancel("--signal=USR1", job_id)
        code, _, err, _ = self.finish(batch, 90)
        output = read_text(output_file.replace("%j", job_id))
        self.assertEqual(code, 0, f"{err}\n{output}")
        self.assertIn("srun exited 0", output)
        self.check_every_worker_got_usr1(out_dir, output)


class RequeueTemplateTest(FailureCase):
    """deploy/slurm/ddp-requeue.sbatch with deploy/examples/checkpoint_demo.py: the warning
    signal makes every worker checkpoint, the job requeues itself, and its next run resumes."""

    STEPS = 60

    def test_checkpoint_requeue_resume(self):
        checkpoints = self.out_dir("checkpoints")
        output_file = os.path.join(self.tmp, "slurm-%j.out")
        # The cluster's nodes have 4 fake GPUs and 8 CPUs: ask for 2 GPUs and 1 CPU instead of
        # the template's 8 and 32, so that the agent starts two workers per node, one per GPU.
        env = self.env(RDZV_AGENT=AGENT, PYTHON=sys.executable, TRAIN_SCRIPT=CHECKPOINT_DEMO,
                       CHECKPOINT_DIR=checkpoints)
        batch = self.start(["sbatch", "--wait", "--parsable", f"--job-name={self.job_name}",
                            f"--chdir={self.tmp}", f"--output={output_file}", "--nodes=2",
                            "--gpus-per-node=2", "--cpus-per-task=1", REQUEUE_TEMPLATE,
                            "--steps", str(self.STEPS)], env)
        job_id = self.job_id()
        output_path = output_file.replace("%j", job_id)

        # The warning --signal=B:USR1@120 would give near the time limit, now: to the batch
        # shell only, once every worker is training.
        self.wait_for(lambda: len(re.findall(r"rank \d: step 10\b", read_text(output_path))) == 4,
                      60, "four workers at step 10")
        self.scancel("--batch", "--signal=USR1", job_id)

        # Slurm holds a requeued job back for a while (BeginTime); let it start again in a few
        # seconds: at once, its nodes may still refuse the run's credential, which they revoked
        # when the first run was killed ("Job credential revoked"), and the run fails.
        self.wait_for(lambda: "run 2 of job" in read_text(output_path) or
                      self.job_state(job_id).startswith("PENDING"), 60, "the job requeued")
        if "run 2 of job" not in read_text(output_path):
            update = subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now+5"],
                                    env=base_env(), capture_output=True, text=True, timeout=30)
            self.assertEqual(update.returncode, 0, update.stderr)

        code, _, err, _ = self.finish(batch, 180)
        if code != 0:
            # sbatch --wait polls the job's state, and a requeue passes through an ended one: on
            # a busy machine it can return then, between the runs. The job's own end decides.
            self.wait_for(lambda: self.job_state(job_id) == "", 180, "the job's second run")
            shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=base_env(),
                                   capture_output=True, text=True, timeout=30).stdout
            code = 0 if re.search(r"\bExitCode=0:0\b", shown) else code
            err += shown
        output = read_text(output_path)
        self.assertEqual(code, 0, f"{err}\n{output}")
        first, sep, second = output.partition(f"run 2 of job {job_id}")
        self.assertTrue(sep, f"the job did not run again\n{output}")
        self.assertIn(f"run 1 of job {job_id}", first)
        self.assertIn("SIGUSR1: asking the workers to checkpoint", first)
        self.assertIn(f"workers checkpointed; requeueing job {job_id}", first)
        self.assertNotIn("run 3 of job", second)
        self.assertNotIn("SIGUSR1", second)
        total = sum(range(self.STEPS))
        for rank in range(4):
            stopped = re.findall(rf"(?m)^\[{rank}\]: rank {rank}: checkpointed at step (\d+)$",
                                 first)
            self.assertEqual(len(stopped), 1, f"rank {rank}\n{output}")
            self.assertGreaterEqual(int(stopped[0]), 10)
            self.assertLess(int(stopped[0]), self.STEPS)
            self.assertRegex(second, rf"(?m)^\[{rank}\]: rank {rank}: resumed from step "
                             rf"{stopped[0]} \(restart 1\)$")
            # Neither a lost nor a repeated step: the same total as an uninterrupted run.
            self.assertRegex(second, rf"(?m)^\[{rank}\]: rank {rank}: finished {self.STEPS} "
                             rf"steps, total {total}$")
            self.assertNotIn(f"rank {rank}: finished", first)


if __name__ == "__main__":
    unittest.main()
