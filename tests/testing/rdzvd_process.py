"""rdzvd and rdzv-agents for Python tests, on loopback. Standard library only.

    with Rdzvd() as rdzvd:            # rdzvd --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0
        agent = rdzvd.agent("job", node=0, nnodes=2, worker="sleep 5")
        ...
        assert rdzvd.stop() == 0      # SIGTERM; its exit code

Leaving the `with` block stops everything started (SIGKILL to the agents' process groups,
SIGTERM then SIGKILL to rdzvd) and waits for it; every process also gets SIGKILL if the test
process dies (PR_SET_PDEATHSIG). RDZVD_BIN and RDZV_AGENT_BIN name the binaries (ctest sets
them).
"""
import ctypes
import os
import signal
import subprocess
import tempfile
import time

RDZVD = os.environ.get("RDZVD_BIN", "")
AGENT = os.environ.get("RDZV_AGENT_BIN", "")


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG



def read_whole(f):
    """All of a log file a child process writes to. pread, not seek and read: the child shares
    the file's offset, and a seek would make its next line overwrite what is there."""
    fd = f.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")

class Rdzvd:
    """rdzvd on free loopback ports (gRPC and metrics), and the agents started against it.
    Leaving the `with` block stops the agents (SIGKILL to their groups) and rdzvd (SIGTERM, then
    SIGKILL after 10 s), and waits for all of them."""

    def __init__(self, env=None, auth=("--auth", "none")):
        self.env = env
        self.auth = list(auth)
        self.port = 0
        self.metrics_port = 0
        self.returncode = None
        self._stderr = tempfile.TemporaryFile()
        self._log_text = ""
        self._process = None
        self.agents = []
        self._agent_logs = []

    def __enter__(self):
        for binary in (RDZVD, AGENT):
            if not binary or not os.access(binary, os.X_OK):
                raise RuntimeError("RDZVD_BIN=%r / RDZV_AGENT_BIN=%r: build rdzvd and rdzv-agent "
                                   "and set them (ctest does)" % (RDZVD, AGENT))
        self._process = subprocess.Popen(
            [RDZVD, *self.auth, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            env=self.env, start_new_session=True, preexec_fn=_die_with_parent)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (self.port and self.metrics_port):
                for line in self.log().splitlines():
                    if "serving on" in line and "(port " in line:
                        self.port = int(line.rsplit("(port ", 1)[1].split(")")[0])
                    if "metrics on" in line and "(port " in line:
                        self.metrics_port = int(line.rsplit("(port ", 1)[1].split(")")[0])
                if self._process.poll() is not None:
                    break
                time.sleep(0.05)
            if not (self.port and self.metrics_port):
                raise RuntimeError("rdzvd did not start: %s" % self.log())
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def agent(self, job, node, nnodes, worker, args=(), env=None, cwd=None):
        """An agent of JOB as node NODE of NNODES (host name nNODE) whose one worker runs the
        shell command WORKER; ARGS go before `--`, ENV replaces the environment."""
        log = tempfile.TemporaryFile()
        self._agent_logs.append(log)
        process = subprocess.Popen(
            [AGENT, "--rdzv-endpoint", "127.0.0.1:%d" % self.port, "--rdzv-id", job,
             "--nnodes", str(nnodes), "--node-rank", str(node), "--host-name", "n%d" % node,
             "--join-timeout", "60", *args, "--", "bash", "-c", worker],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
            start_new_session=True, preexec_fn=_die_with_parent)
        process.log = log
        self.agents.append(process)
        return process

    @staticmethod
    def output(process):
        """What an agent started by agent() wrote (stdout and stderr)."""
        return read_whole(process.log)

    def stop(self):
        """SIGTERM to rdzvd; returns its exit code."""
        self._process.send_signal(signal.SIGTERM)
        self.returncode = self._process.wait(timeout=20)
        return self.returncode

    def __exit__(self, *exc):
        for process in self.agents:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        for log in self._agent_logs:
            log.close()
        if self._process is None:
            self._stderr.close()
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.returncode = self._process.wait()
        self._log_text = self.log()
        self._stderr.close()

    @property
    def pid(self):
        return self._process.pid

    def log(self):
        if self._stderr.closed:
            return self._log_text
        return read_whole(self._stderr)
