"""A real Prometheus for tests: scrapes one target and answers queries. Standard library only.

    with Prometheus("127.0.0.1:%d" % port) as prom:
        prom.wait_for("rdzv_joins_total", lambda samples: samples and samples[0].value >= 3)
        rss = prom.query("process_resident_memory_bytes")[0].value

Prometheus (Debian's prometheus package, /usr/bin/prometheus; PROMETHEUS_BIN overrides) runs
with a generated configuration: one static target under the job name "rdzv", scraped every
second, the web API on a free port of 127.0.0.1 and its database in a temporary directory. It
talks to nothing but the target and its client, both on loopback.

Leaving the `with` block, normally or through an exception, stops Prometheus (SIGTERM, then
SIGKILL after 10 s) and removes its directory. Prometheus also gets SIGKILL if the process that
started it dies (PR_SET_PDEATHSIG), so even a test killed outright leaves nothing running.
"""
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Dict, List, NamedTuple, Optional

DEFAULT_BINARY = "/usr/bin/prometheus"
JOB = "rdzv"

# Requests go straight to loopback, whatever *_proxy variables the environment has.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Sample(NamedTuple):
    labels: Dict[str, str]  # including __name__ for a plain selector
    value: float


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGKILL when the parent thread exits.
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


class Prometheus:
    """One Prometheus process scraping `target` ("host:port"). Use it as a context manager."""

    def __init__(self, target: str, binary: Optional[str] = None, scrape_interval: str = "1s",
                 start_timeout: float = 60.0):
        self.target = target
        self.binary = binary or os.environ.get("PROMETHEUS_BIN") or DEFAULT_BINARY
        self.scrape_interval = scrape_interval
        self.start_timeout = start_timeout
        self.directory: Optional[str] = None
        self.port = 0
        self._process: Optional[subprocess.Popen] = None
        self._log = None

    # ---- life cycle

    def __enter__(self) -> "Prometheus":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process else None

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def start(self) -> None:
        if not os.access(self.binary, os.X_OK):
            raise RuntimeError("%s is not an executable; install Debian's prometheus package or "
                               "set PROMETHEUS_BIN" % self.binary)
        self.directory = tempfile.mkdtemp(prefix="rdzv-prometheus-")
        config = os.path.join(self.directory, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n"
                    "  scrape_interval: %s\n"
                    "  scrape_timeout: %s\n"
                    "  evaluation_interval: %s\n"
                    "scrape_configs:\n"
                    "  - job_name: %s\n"
                    "    static_configs:\n"
                    "      - targets: [%s]\n"
                    % (self.scrape_interval, self.scrape_interval, self.scrape_interval,
                       json.dumps(JOB), json.dumps(self.target)))
        # The free port may be taken by someone else before Prometheus binds it: try again.
        for _ in range(3):
            self.port = _free_loopback_port()
            self._log = open(os.path.join(self.directory, "prometheus.log"), "wb")
            self._process = subprocess.Popen(
                [self.binary,
                 "--config.file=" + config,
                 "--storage.tsdb.path=" + os.path.join(self.directory, "data"),
                 "--web.listen-address=127.0.0.1:%d" % self.port,
                 "--log.level=info"],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                cwd=self.directory, start_new_session=True, preexec_fn=_die_with_parent)
            if self._wait_ready():
                return
            if "address already in use" not in self.log_tail():
                break
            self._kill()
        raise RuntimeError("prometheus did not become ready within %.0f s; its log ends with:\n%s"
                           % (self.start_timeout, self.log_tail()))

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with _OPENER.open(self.url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def _kill(self) -> None:
        """Stops the process group: SIGTERM, SIGKILL after 10 s; waits for it."""
        if self._process is None:
            return
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            if self._process.poll() is not None:
                break
            try:
                os.killpg(self._process.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self._process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        # Anything else left in its group (it starts none, but be sure).
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self._log:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """Stops Prometheus and removes its directory. Safe to call more than once."""
        self._kill()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def log_tail(self, lines: int = 30) -> str:
        if not self.directory:
            return "(no log)"
        try:
            with open(os.path.join(self.directory, "prometheus.log"), "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError as e:
            return "(no log: %s)" % e
        return "\n".join(text.splitlines()[-lines:])

    # ---- the HTTP API

    def _get(self, path: str, params: Optional[Dict[str, str]] = None) -> dict:
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with _OPENER.open(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:
            # Bad queries come back as 400 with the reason in the body.
            body = json.load(e)
        if body.get("status") != "success":
            raise RuntimeError("prometheus %s: %s: %s"
                               % (path, body.get("errorType"), body.get("error")))
        return body["data"]

    def query(self, expr: str) -> List[Sample]:
        """The instant vector (or scalar) `expr` evaluates to now, via /api/v1/query."""
        data = self._get("/api/v1/query", {"query": expr})
        if data["resultType"] == "vector":
            return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        raise RuntimeError("query %r returned a %s; expected an instant vector or scalar"
                           % (expr, data["resultType"]))

    def targets(self) -> List[dict]:
        """The active scrape targets: scrapeUrl, health, lastError, ..."""
        return self._get("/api/v1/targets")["activeTargets"]

    def wait_for(self, expr: str, predicate: Callable[[List[Sample]], bool],
                 timeout: float = 30.0) -> List[Sample]:
        """Queries `expr` until predicate(samples) holds; returns those samples. Raises
        AssertionError after `timeout` seconds, with the last result and the targets' state."""
        deadline = time.monotonic() + timeout
        while True:
            samples = self.query(expr)
            if predicate(samples):
                return samples
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        try:
            targets = ["%s %s %s" % (t.get("scrapeUrl"), t.get("health"), t.get("lastError"))
                       for t in self.targets()]
        except (RuntimeError, OSError) as e:
            targets = ["(cannot list targets: %s)" % e]
        raise AssertionError("%r did not reach the expected value within %.0f s; last result: "
                             "%s; targets: %s" % (expr, timeout, samples, "; ".join(targets)))
