"""No user can hurt another user's job through rdzvd's shared resources.

Each test runs a victim job of root's (two real agents, MUNGE, a private munged) on an rdzvd with
--memory-limit-mb 256, and, while the job runs, one attack from tests/isolation_attacker.py as
another uid (nobody). The victim must end 0 with ranks 0 and 1; rdzvd's memory and open files
must stay bounded during the attack and come back afterwards; the operator's view (rdzvctl
status, /metrics) must answer. Each prints its figures (RSS and fds before, at most during, and
after; the victim's time against an unattacked run).

Needs root (a second uid) and munged; skipped otherwise. Everything runs on loopback and is
stopped when each test ends.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "testing"))
from rdzvd_process import Rdzvd  # noqa: E402

ATTACKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "isolation_attacker.py")
RDZVCTL = os.environ.get("RDZVCTL_BIN", "")
VICTIM_WORKER = "sleep 4; echo rank=$RANK of $WORLD_SIZE"
# The attacker connects from another loopback address: another host, as rdzvd sees it. The
# victim's agents and the admin's rdzvctl come from 127.0.0.1.
ATTACKER_HOST = "127.0.0.2"
# Connections that carry no authenticated call go after 2 s (60 by default): the victim's, which
# do, must outlive that.
UNUSED_2S = ("--unused-connection-timeout-ms", "2000")
# The authenticated floods open all their connections (hundreds) before sending a call on any,
# as no real client does: the host's budget of connections not yet authenticated would drop
# them before they prove themselves. What those tests bound is what comes after.
UNPROVEN_ANY = ("--max-unproven-connections-per-host", "2000")
MIB = 1 << 20
# What rdzvd may keep of an attack's memory once it is over: it hands back more than this.
RSS_KEPT = 64 * MIB


def rss_and_fds(pid):
    with open("/proc/%d/status" % pid) as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir("/proc/%d/fd" % pid))


class Sampler:
    """rdzvd's RSS and fds, every 50 ms, while it runs."""

    def __init__(self, pid):
        self.pid = pid
        self.max_rss = 0
        self.max_fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                rss, fds = rss_and_fds(self.pid)
            except (OSError, StopIteration):
                return
            self.max_rss = max(self.max_rss, rss)
            self.max_fds = max(self.max_fds, fds)
            time.sleep(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join()


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("munged"),
                     "needs root (to run a second uid) and munged")
class IsolationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="rdzv-isolation-")
        os.chmod(cls.dir, 0o755)  # nobody reaches the socket; the key stays private
        key = os.path.join(cls.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        cls.socket = os.path.join(cls.dir, "munge.socket")
        cls.munged = subprocess.Popen(
            ["munged", "--foreground", "--force", "--socket=" + cls.socket, "--key-file=" + key,
             "--pid-file=" + os.path.join(cls.dir, "munged.pid"),
             "--log-file=" + os.path.join(cls.dir, "munged.log"),
             "--seed-file=" + os.path.join(cls.dir, "munged.seed")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not os.path.exists(cls.socket):
            time.sleep(0.05)
        cls.unattacked_s = None

    @classmethod
    def tearDownClass(cls):
        cls.munged.terminate()
        cls.munged.wait(timeout=10)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def rdzvd(self, memory_mb=256, extra=()):
        return Rdzvd(auth=("--auth", "munge", "--munge-socket", self.socket,
                           "--memory-limit-mb", str(memory_mb), *extra))

    def victim(self, rdzvd, job="victim"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RDZV_", "SLURM_"))}
        env["RDZV_CONFIG"] = "/dev/null"
        return [rdzvd.agent(job, node, 2, VICTIM_WORKER, args=("--munge-socket", self.socket),
                            env=env) for node in range(2)]

    def check_victim(self, rdzvd, agents):
        for agent in agents:
            agent.wait(timeout=90)
        out = "".join(Rdzvd.output(a) for a in agents)
        for agent in agents:
            self.assertEqual(agent.returncode, 0, out + rdzvd.log()[-3000:])
        self.assertIn("rank=0 of 2", out)
        self.assertIn("rank=1 of 2", out)

    def status(self, rdzvd):
        result = subprocess.run(
            [RDZVCTL, "--rdzv-endpoint", rdzvd.endpoint, "--munge-socket", self.socket, "status"],
            capture_output=True, text=True, timeout=30,
            env={"PATH": os.environ.get("PATH", ""), "RDZV_CONFIG": "/dev/null"})
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout

    def wait_running(self, rdzvd):
        """Until the victim's agents have joined and run their workers."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(line.startswith("victim") and " running " in line
                   for line in self.status(rdzvd).splitlines()):
                return
            time.sleep(0.1)
        self.fail("the victim job did not start: " + rdzvd.log()[-2000:])

    def unattacked(self):
        """The victim's time to finish on an rdzvd nobody attacks (once per run)."""
        if IsolationTest.unattacked_s is None:
            with self.rdzvd() as rdzvd:
                started = time.monotonic()
                agents = self.victim(rdzvd)
                self.check_victim(rdzvd, agents)
                IsolationTest.unattacked_s = time.monotonic() - started
        return IsolationTest.unattacked_s

    def attack(self, name, target="grpc", count=1000, seconds=4, max_rss_mib=200,
               during=None, memory_mb=256, rdzvd_args=(), max_extra_fds=None,
               source=ATTACKER_HOST):
        """Runs the victim and ATTACK (as nobody) against rdzvd's gRPC or metrics port, and
        checks the victim, rdzvd's bounds and what it gave back. DURING(rdzvd) runs as root while
        the attack holds its connections. The attacker's summary."""
        baseline = self.unattacked()
        with self.rdzvd(memory_mb, rdzvd_args) as rdzvd:
            rss0, fds0 = rss_and_fds(rdzvd.pid)
            sampler = Sampler(rdzvd.pid)
            started = time.monotonic()
            agents = self.victim(rdzvd)
            ended = []

            def wait_victim():
                for agent in agents:
                    agent.wait(timeout=90)
                ended.append(time.monotonic())

            waiter = threading.Thread(target=wait_victim, daemon=True)
            waiter.start()
            self.wait_running(rdzvd)
            port = rdzvd.port if target == "grpc" else rdzvd.metrics_port
            attacker = subprocess.Popen(
                ["runuser", "-u", "nobody", "--", "/usr/bin/python3", ATTACKER, name,
                 "127.0.0.1:%d" % port, "--count", str(count), "--seconds", str(seconds),
                 "--munge-socket", self.socket, "--source", source],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if during is not None:
                time.sleep(1.5)
                during(rdzvd)
            out, err = attacker.communicate(timeout=120)
            self.assertEqual(attacker.returncode, 0, err)
            summary = json.loads(out.strip().splitlines()[-1])
            waiter.join(timeout=100)
            self.check_victim(rdzvd, agents)
            victim_s = ended[0] - started
            # What the attack took comes back once its connections are gone and idle ones closed.
            deadline = time.monotonic() + 25
            while time.monotonic() < deadline:
                rss1, fds1 = rss_and_fds(rdzvd.pid)
                if fds1 <= fds0 + 4 and rss1 <= rss0 + RSS_KEPT:
                    break
                time.sleep(0.2)
            sampler.stop()
            rss1, fds1 = rss_and_fds(rdzvd.pid)
            figures = ("%s: %s; rdzvd RSS %.1f -> max %.1f -> %.1f MiB, fds %d -> max %d -> %d; "
                       "victim %.2f s against %.2f s unattacked (%.2fx)" % (
                           name, json.dumps(summary), rss0 / MIB, sampler.max_rss / MIB,
                           rss1 / MIB, fds0, sampler.max_fds, fds1, victim_s, baseline,
                           victim_s / baseline))
            print(figures, flush=True)
            self.assertLess(sampler.max_rss, max_rss_mib * MIB, figures)
            self.assertLessEqual(fds1, fds0 + 4, figures)
            self.assertLessEqual(rss1, rss0 + RSS_KEPT, figures)
            if max_extra_fds is not None:
                self.assertLessEqual(sampler.max_fds, fds0 + max_extra_fds, figures)
            self.assertLess(victim_s, baseline * 1.5 + 1, figures)
            self.log = rdzvd.log()
            return summary

    def test_unauthenticated_half_sent_messages(self):
        summary = self.attack("half-sent", count=3200, rdzvd_args=UNUSED_2S)
        # Every stream is refused on its headers (or its connection closed).
        self.assertGreaterEqual(summary["ended_or_closed"], summary["opened"] * 9 // 10)

    def test_unauthenticated_header_only_streams(self):
        summary = self.attack("headers-only", count=3200, rdzvd_args=UNUSED_2S)
        self.assertGreaterEqual(summary["ended_or_closed"], summary["opened"] * 9 // 10)

    def test_idle_connection_flood(self):
        # Past 512 connections from its host refused at once; the rest closed after 2 s unused.
        summary = self.attack("idle-connections", count=900, seconds=6, rdzvd_args=UNUSED_2S)
        self.assertGreater(summary["opened"], 500)
        self.assertGreaterEqual(summary["raw_closed_by_server"], summary["opened"] * 9 // 10)

    def test_connections_per_host_are_bounded(self):
        self.during = None

        def during(rdzvd):
            # The refused ones are closed at once (the attack's burst takes a moment to clear).
            time.sleep(1)
            self.during = (rss_and_fds(rdzvd.pid)[1], self.status(rdzvd))

        summary = self.attack("idle-connections", count=1000, seconds=4, during=during,
                              rdzvd_args=("--max-connections-per-host", "100"))
        fds, status = self.during
        self.assertIn("victim", status)  # the admin's host is another
        # All but the host's 100 closed at once, long before they count as unused.
        self.assertGreaterEqual(summary["raw_closed_by_server"], summary["opened"] - 100)
        self.assertLess(fds, 100 + 40, "rdzvd's open files while the attack holds its connections")
        self.assertIn("--max-connections-per-host", self.log)

    def test_authenticated_header_only_streams(self):
        # A valid credential and never a message: the connection never carries a call, and goes.
        summary = self.attack("authenticated-headers-only", count=1600, seconds=4,
                              rdzvd_args=UNUSED_2S)
        self.assertGreaterEqual(summary["ended_or_closed"], summary["opened"] * 9 // 10)

    def test_authenticated_padded_joins_up_to_the_user_limit(self):
        self.attack("padded-joins", count=3500, seconds=3, max_rss_mib=400,
                    rdzvd_args=UNPROVEN_ANY)
        # Each join's padding is dropped, and nobody's calls waiting for their messages are
        # bounded (or, once they are in, the memory its agents hold).
        self.assertTrue("calls waiting to start" in self.log
                        or "--max-memory-per-user-mb" in self.log, self.log[-2000:])

    def test_authenticated_joins_past_the_users_memory_share(self):
        # 4,000 agents of ~37 KiB: past nobody's share of 96 MiB (3/8 of 256), refused, naming it.
        self.attack("status-flood", count=4000, seconds=3, max_rss_mib=300,
                    rdzvd_args=UNPROVEN_ANY)
        self.assertIn("--max-memory-per-user-mb", self.log)

    def test_non_reading_streams(self):
        self.attack("non-reading", count=2000, seconds=4, max_rss_mib=300,
                    rdzvd_args=UNPROVEN_ANY)

    def test_status_flood_does_not_break_the_admins_status(self):
        self.status_out = ""

        def status(rdzvd):
            # Every answer comes, while nobody's agents join, until it has to leave some out.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "left out" not in self.status_out:
                self.status_out = self.status(rdzvd)
                time.sleep(0.5)

        # Room for nobody's 8,000 agents (each user may hold 3/8 of the limit).
        self.attack("status-flood", count=8000, seconds=20, max_rss_mib=600, during=status,
                    memory_mb=1024,
                    rdzvd_args=("--max-connections-per-host", "2000", *UNPROVEN_ANY))
        self.assertIn("left out", self.status_out)

    def test_unauthenticated_connections_from_the_victims_host_do_not_keep_it_out(self):
        """A user of the victim's own host without credentials opens 60 connections a second for
        60 s and holds them all (a call without a credential on each): rdzvd's default bounds
        (512 per host, 128 of them unauthenticated). The victim starts once the attacker holds
        more than the host's bound and must take at most 1.1x its time alone."""
        baseline = self.unattacked()
        with self.rdzvd() as rdzvd:
            fds0 = rss_and_fds(rdzvd.pid)[1]
            sampler = Sampler(rdzvd.pid)
            attacker = subprocess.Popen(
                ["runuser", "-u", "nobody", "--", "/usr/bin/python3", ATTACKER,
                 "connection-churn", rdzvd.endpoint, "--rate", "60", "--seconds", "60",
                 "--source", "127.0.0.1"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # Past the 512 of the host's bound: the old rule refused the victim from here on.
            time.sleep(12)
            self.assertIsNone(attacker.poll(), attacker.stderr.read() if attacker.poll() else "")
            started = time.monotonic()
            agents = self.victim(rdzvd)
            self.check_victim(rdzvd, agents)
            victim_s = time.monotonic() - started
            scraped = self.scrape_counters(rdzvd)
            out, err = attacker.communicate(timeout=120)
            sampler.stop()
            self.assertEqual(attacker.returncode, 0, err)
            summary = json.loads(out.strip().splitlines()[-1])
            figures = ("connection-churn: %s; rdzvd fds %d -> max %d; victim %.2f s against %.2f s "
                       "unattacked (%.2fx); rdzv_connections_dropped_total %s" % (
                           json.dumps(summary), fds0, sampler.max_fds, victim_s, baseline,
                           victim_s / baseline, scraped.get("rdzv_connections_dropped_total")))
            print(figures, flush=True)
            self.assertGreater(summary["opened"] - summary["failed"], 3000, figures)
            self.assertLessEqual(victim_s, baseline * 1.1, figures)
            # The attacker's connections were dropped as the budget filled, and counted.
            self.assertGreater(scraped.get("rdzv_connections_dropped_total", 0), 500, figures)
            self.assertGreater(summary["closed_by_server"], summary["opened"] - 600, figures)
            self.assertLess(sampler.max_fds, fds0 + 512 + 64, figures)

    def scrape_counters(self, rdzvd):
        """rdzvd's /metrics, its unlabelled samples by name."""
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % rdzvd.metrics_port,
                                    timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.split()[:2]
                out[name] = float(value)
        return out

    def test_metrics_answer_beside_partial_requests_and_slow_readers(self):
        self.latencies = []

        def scrape(rdzvd):
            # From another host (127.0.0.2) while one host (127.0.0.1) holds 1,000 partial
            # requests and 64 connections that do not read their answers.
            for path in ("/metrics", "/healthz", "/metrics"):
                started = time.monotonic()
                conn = http.client.HTTPConnection("127.0.0.1", rdzvd.metrics_port, timeout=5,
                                                  source_address=(ATTACKER_HOST, 0))
                conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                conn.close()
                self.latencies.append(time.monotonic() - started)
                self.assertEqual(response.status, 200)

        self.attack("partial-http", target="metrics", count=1000, seconds=4, during=scrape,
                    source="127.0.0.1")
        print("scrapes from 127.0.0.2 beside 1,000 partial requests and 64 slow readers: %s" %
              ", ".join("%.3f s" % t for t in self.latencies), flush=True)
        self.assertLess(max(self.latencies), 1.0)

    def test_a_credential_flood_while_munged_is_slow_delays_only_its_user(self):
        """nobody floods rdzvd with 12,000 valid credentials on connections that proved its uid,
        while munged is stopped (SIGSTOP) for a few seconds. root's status call, on a new
        connection, is checked as soon as munged answers again, not after nobody's flood: its
        uid's credentials wait in a share of their own (as do the calls of connections not yet
        proven), and the shares take turns at the decoders."""
        with self.rdzvd() as rdzvd:
            attacker = subprocess.Popen(
                ["runuser", "-u", "nobody", "--", "/usr/bin/python3", ATTACKER,
                 "credential-flood", rdzvd.endpoint, "--count", "12000", "--seconds", "6",
                 "--munge-socket", self.socket],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if attacker.stdout.readline().strip() != "ready":
                attacker.kill()
                self.fail("the attacker did not get ready: " + attacker.communicate()[1])
            os.kill(self.munged.pid, signal.SIGSTOP)
            try:
                attacker.stdin.write("go\n")
                attacker.stdin.flush()
                time.sleep(2)  # the flood is queued behind the stopped munged
                status = subprocess.Popen(
                    [RDZVCTL, "--rdzv-endpoint", rdzvd.endpoint, "--munge-socket", self.socket,
                     "status"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env={"PATH": os.environ.get("PATH", ""), "RDZV_CONFIG": "/dev/null"})
                time.sleep(1)
            finally:
                os.kill(self.munged.pid, signal.SIGCONT)
            resumed = time.monotonic()
            out, err = status.communicate(timeout=60)
            answered = time.monotonic() - resumed
            attacker.communicate(timeout=60)
            log = rdzvd.log()
            print("root's status answered %.3f s after munged resumed, beside nobody's flood of "
                  "12,000 credentials" % answered, flush=True)
            self.assertEqual(status.returncode, 0, err + log[-2000:])
            # nobody's own share filled and its calls were refused (UNAVAILABLE), not root's.
            self.assertIn("uid 65534 has 8192 credentials waiting", log)
            self.assertLess(answered, 1.0, log[-2000:])

    def test_idle_metrics_connections(self):
        def scrape(rdzvd):
            started = time.monotonic()
            for path in ("/metrics", "/healthz"):
                with urllib.request.urlopen(
                        "http://127.0.0.1:%d%s" % (rdzvd.metrics_port, path), timeout=5) as r:
                    self.assertEqual(r.status, 200)
            self.assertLess(time.monotonic() - started, 2)

        self.attack("idle-connections", target="metrics", count=900, seconds=4, during=scrape)


if __name__ == "__main__":
    unittest.main()
