#!/usr/bin/env python3
"""rdzvd's metrics as a real Prometheus sees them.

RdzvdDuringRealJobs: a real rdzvd with --metrics-listen on loopback, scraped every second by a
real Prometheus while real rdzv-agents run three jobs through it (one succeeds, one has a worker
fail, one restarts after a failure) and rdzvctl makes a call over a limit; the test reads the
jobs, agents, joins, rounds, durations, aborts, restarts and refused calls back through
Prometheus's query API.

metrics_demo_server serves a Metrics registry through MetricsHttpServer and counts a join every
100 ms; a real Prometheus (tests/testing/prometheus.py) scrapes it every second, and the tests
read the series back through Prometheus's query API, as a dashboard would. A scrape that
Prometheus cannot parse marks the target down, so these tests also check the text format.

Inputs (ctest sets them; see tests/CMakeLists.txt):
  METRICS_DEMO_SERVER  the metrics_demo_server binary
  RDZVD_BIN, RDZV_AGENT_BIN, RDZVCTL_BIN  rdzvd, rdzv-agent and rdzvctl
  PROMETHEUS_BIN       Prometheus (default /usr/bin/prometheus)

  METRICS_DEMO_SERVER=build/release/tests/metrics_demo_server \\
      /usr/bin/python3 tests/metrics_prometheus_test.py -v
"""
import ctypes
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "testing"))
import prometheus  # noqa: E402
from rdzvd_process import Rdzvd  # noqa: E402

DEMO = os.environ.get("METRICS_DEMO_SERVER", "")
RDZVCTL = os.environ.get("RDZVCTL_BIN", "")


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def processes_mentioning(text):
    """Pids of processes whose command line contains `text`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


class DemoServer:
    """metrics_demo_server on a free loopback port. It exits when its stdin closes; leaving the
    `with` block closes it, and kills the server if it does not exit within 10 s."""

    def __init__(self):
        self.port = 0
        self.returncode = None
        self.stderr_text = ""
        self._stderr = tempfile.TemporaryFile()
        self._process = None

    def __enter__(self):
        if not DEMO or not os.access(DEMO, os.X_OK):
            raise RuntimeError("METRICS_DEMO_SERVER=%r is not an executable; build the "
                               "metrics_demo_server target and set it (ctest does)" % DEMO)
        self._process = subprocess.Popen(
            [DEMO, "--listen", "127.0.0.1:0", "--timeout-s", "170"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            start_new_session=True, preexec_fn=_die_with_parent)
        try:
            ready, _, _ = select.select([self._process.stdout], [], [], 30)
            line = self._process.stdout.readline().decode() if ready else ""
            if not line.startswith("listening on "):
                raise RuntimeError("metrics_demo_server did not start: %r %s"
                                   % (line, self._read_stderr()))
            self.port = int(line.split()[-1])
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if self._process is None:
            return
        try:
            self._process.stdin.close()
            self.returncode = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._process.wait()
            self._process.stdout.close()
            self.stderr_text = self._read_stderr()
            self._stderr.close()

    @property
    def pid(self):
        return self._process.pid

    def _read_stderr(self):
        # pread: rdzvd shares this file's offset, and a seek would move its next write.
        fd = self._stderr.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")


class RdzvdDuringRealJobs(unittest.TestCase):

    def test_prometheus_sees_jobs_agents_rounds_and_aborts(self):
        with Rdzvd() as rdzvd:
            target = "127.0.0.1:%d" % rdzvd.metrics_port
            with prometheus.Prometheus(target) as prom:
                prom_pid, prom_dir = prom.pid, prom.directory
                prom.wait_for('up{job="rdzv"}', lambda s: len(s) == 1 and s[0].value == 1)
                self.assertEqual(prom.query("rdzv_agents_attached")[0].value, 0)
                self.assertEqual(prom.query("rdzv_joins_total")[0].value, 0)

                # A job of two agents whose workers run for a while, then succeed.
                good = [rdzvd.agent("good", node, 2, "sleep 6") for node in (0, 1)]
                prom.wait_for('rdzv_jobs{state="running"}', lambda s: s and s[0].value == 1)
                prom.wait_for("rdzv_agents_attached", lambda s: s and s[0].value == 2)
                self.assertEqual(prom.query("rdzv_joins_total")[0].value, 2)
                self.assertEqual(prom.query("rdzv_rounds_completed_total")[0].value, 1)
                self.assertEqual(prom.query("rdzv_rendezvous_duration_seconds_count")[0].value, 1)
                # Both agents joined at once: the round filled in well under 10 s.
                self.assertLess(prom.query("rdzv_rendezvous_duration_seconds_sum")[0].value, 10)
                for process in good:
                    self.assertEqual(process.wait(timeout=60), 0)

                # A job whose worker on node 1 fails: the job ends with a worker_failed abort.
                bad = [rdzvd.agent("bad", 0, 2, "sleep 30"), rdzvd.agent("bad", 1, 2, "exit 3")]
                for process in bad:
                    self.assertEqual(process.wait(timeout=60), 3)
                prom.wait_for('rdzv_aborts_total{cause="worker_failed"}',
                              lambda s: s and s[0].value == 1)
                self.assertEqual(prom.query('rdzv_aborts_total{cause="agent_lost"}')[0].value, 0)
                self.assertEqual(prom.query("rdzv_joins_total")[0].value, 4)
                self.assertEqual(prom.query("rdzv_rounds_completed_total")[0].value, 2)
                prom.wait_for("rdzv_agents_attached", lambda s: s and s[0].value == 0)
                # The failed job is kept as ended for agents that come back; none is running.
                self.assertEqual(prom.query('rdzv_jobs{state="running"}')[0].value, 0)
                self.assertEqual(prom.query('rdzv_jobs{state="ended"}')[0].value, 1)

                rss = prom.query("process_resident_memory_bytes")[0].value
                self.assertGreater(rss, 1 << 20)
                self.assertLess(rss, 1 << 30)
                self.assertGreater(prom.query("process_open_fds")[0].value, 3)
                self.assertEqual(prom.query('rdzv_refused_calls_total{reason="invalid"}')[0].value,
                                 0)
                self.assertEqual(prom.query("rdzv_restarts_total")[0].value, 0)
                self.assertEqual(prom.query('rdzv_refused_calls_total{reason="limit"}')[0].value,
                                 0)

                # A job under --max-restarts 1 whose rank 1 fails in its first run: every agent
                # starts its workers again, and the second run succeeds.
                worker = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then '
                          '[ "$RANK" = 1 ] && exit 3; sleep 30; fi')
                again = [rdzvd.agent("again", node, 2, worker, args=("--max-restarts", "1"))
                         for node in (0, 1)]
                for process in again:
                    self.assertEqual(process.wait(timeout=60), 0, Rdzvd.output(process))
                prom.wait_for("rdzv_restarts_total", lambda s: s and s[0].value == 1)
                self.assertEqual(prom.query('rdzv_aborts_total{cause="worker_failed"}')[0].value,
                                 2)
                self.assertEqual(prom.query("rdzv_rounds_completed_total")[0].value, 4)

                # A call over one of rdzvd's limits (a job id of 300 bytes) is refused, and
                # counted by its reason.
                refused = subprocess.run(
                    [RDZVCTL, "--rdzv-endpoint", rdzvd.endpoint, "status", "j" * 300],
                    capture_output=True, text=True, timeout=60,
                    env=dict(os.environ, RDZV_CONFIG=os.devnull))
                self.assertEqual(refused.returncode, 1, refused.stderr)
                self.assertIn("the job id is 300 bytes", refused.stderr)
                prom.wait_for('rdzv_refused_calls_total{reason="limit"}',
                              lambda s: s and s[0].value == 1)
            self.assertEqual(rdzvd.stop(), 0, rdzvd.log())
            rdzvd_pid = rdzvd.pid
        self.assertEqual(processes_mentioning(prom_dir), [])
        self.assertFalse(os.path.exists(prom_dir))
        for pid in (prom_pid, rdzvd_pid):
            with self.assertRaises(ProcessLookupError):
                os.kill(pid, 0)


class PrometheusScrapesRdzvMetrics(unittest.TestCase):

    def test_counters_gauges_histograms_and_process_metrics_reach_prometheus(self):
        with DemoServer() as demo:
            target = "127.0.0.1:%d" % demo.port
            with prometheus.Prometheus(target) as prom:
                prom_pid, prom_dir = prom.pid, prom.directory
                # The target is up: Prometheus parsed every scrape.
                prom.wait_for('up{job="rdzv"}', lambda s: len(s) == 1 and s[0].value == 1)
                first = prom.wait_for("rdzv_joins_total", lambda s: s and s[0].value >= 5)
                self.assertEqual(first[0].labels,
                                 {"__name__": "rdzv_joins_total", "instance": target,
                                  "job": "rdzv"})
                # It goes on counting from scrape to scrape, at the demo's 10 joins a second.
                prom.wait_for("rdzv_joins_total",
                              lambda s: s and s[0].value >= first[0].value + 10)
                # rate() reads low until the series spans its whole window.
                prom.wait_for("rate(rdzv_joins_total[5s])",
                              lambda s: len(s) == 1 and 5 < s[0].value < 15)

                rss = prom.query("process_resident_memory_bytes")
                self.assertEqual(len(rss), 1, rss)
                self.assertGreater(rss[0].value, 1 << 20)
                self.assertLess(rss[0].value, 4 << 30)
                start = prom.query("process_start_time_seconds")[0].value
                self.assertLess(abs(time.time() - start), 600)
                self.assertGreater(prom.query("process_open_fds")[0].value, 3)
                self.assertGreaterEqual(prom.query("process_threads")[0].value, 3)

                # Labelled counters that read 0, and the build info.
                self.assertEqual(prom.query('rdzv_aborts_total{cause="worker_failed"}')[0].value,
                                 0)
                self.assertEqual(
                    prom.query('rdzv_refused_calls_total{reason="unauthenticated"}')[0].value, 0)
                self.assertEqual(prom.query('rdzv_build_info{version="demo"}')[0].value, 1)

                # The histogram's buckets are usable: every observation is 0.25 s, so the median
                # lies in the (0.1, 0.25] bucket.
                prom.wait_for("rdzv_rendezvous_duration_seconds_count",
                              lambda s: s and s[0].value >= 1)
                median = prom.query("histogram_quantile(0.5, rdzv_rendezvous_duration_seconds_bucket)")
                self.assertEqual(len(median), 1, median)
                self.assertGreater(median[0].value, 0.1)
                self.assertLessEqual(median[0].value, 0.25)
            demo_pid = demo.pid

        # Nothing is left: Prometheus stopped and its directory is gone; the demo server exited
        # by itself when its stdin closed.
        self.assertEqual(demo.returncode, 0, demo.stderr_text)
        self.assertEqual(processes_mentioning(prom_dir), [])
        self.assertFalse(os.path.exists(prom_dir))
        for pid in (prom_pid, demo_pid):
            with self.assertRaises(ProcessLookupError):
                os.kill(pid, 0)

    def test_prometheus_is_stopped_when_the_test_body_fails(self):
        # Port 9 (discard) on loopback: nothing listens, so the target is down.
        with self.assertRaises(RuntimeError):
            with prometheus.Prometheus("127.0.0.1:9") as prom:
                prom_pid, prom_dir = prom.pid, prom.directory
                # A wait that cannot succeed says why, from Prometheus's own view of the target.
                with self.assertRaises(AssertionError) as failed:
                    prom.wait_for('up{job="rdzv"} == 1', lambda s: len(s) == 1, timeout=10)
                self.assertIn("127.0.0.1:9", str(failed.exception))
                self.assertIn("connection refused", str(failed.exception))
                raise RuntimeError("the test body failed")
        self.assertEqual(processes_mentioning(prom_dir), [])
        self.assertFalse(os.path.exists(prom_dir))
        with self.assertRaises(ProcessLookupError):
            os.kill(prom_pid, 0)

    def test_a_bad_query_is_reported(self):
        with prometheus.Prometheus("127.0.0.1:9") as prom:
            with self.assertRaises(RuntimeError) as failed:
                prom.query("rate(")
            self.assertIn("bad_data", str(failed.exception))


if __name__ == "__main__":
    # ctest's timeout and Ctrl-C end the run through the context managers, which stop everything.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    unittest.main()
