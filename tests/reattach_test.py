"""A running agent is lost when its agent is gone, not when its stream alone ends.

rdzvd reads the end of a running agent's Join stream whose connection is still up as a reset on
its own side (gRPC's memory quota resets streams, never connections): that agent has a moment to
come back. When the connection goes too, the agent is lost at once. Two agents of a job speak
raw HTTP/2 here (tests/isolation_attacker.py's client), so that one stream can be reset while its
connection stays; rdzvctl tells what rdzvd made of it. Loopback only; everything started is
stopped.
"""
import os
import socket
import struct
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "testing"))
sys.path.insert(0, HERE)
from isolation_attacker import H2, RST_STREAM, frame, grpc_frame, join_request  # noqa: E402
from rdzvd_process import Rdzvd  # noqa: E402

RDZVCTL = os.environ.get("RDZVCTL_BIN", "")
JOIN = "rdzv.v1.Rendezvous/Join"
CANCEL = 0x8


def close(conn):
    """Closes CONN's connection now (its reader thread would hold a plain close back)."""
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


class ReattachTest(unittest.TestCase):
    def status(self, rdzvd, job):
        result = subprocess.run(
            [RDZVCTL, "--rdzv-endpoint", rdzvd.endpoint, "status", job],
            capture_output=True, text=True, timeout=30,
            env={"PATH": os.environ.get("PATH", ""), "RDZV_CONFIG": "/dev/null"})
        return result.stdout + result.stderr

    def running_job(self, rdzvd, job):
        """Two raw agents of JOB, attached and ranked; their connections and stream ids."""
        conns, streams = [], []
        for node in range(2):
            conn = H2(rdzvd.endpoint)
            streams.append(conn.open(JOIN, body=grpc_frame(
                join_request(job, "agent-%d" % node, "h%d" % node, node, 2, 2))))
            conns.append(conn)
        self.wait_for(rdzvd, job, " running ")
        return conns, streams

    def wait_for(self, rdzvd, job, text, within=10):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            out = self.status(rdzvd, job)
            if text in out:
                return time.monotonic()
            time.sleep(0.05)
        self.fail("job %s never showed %r: %s\n%s" % (job, text, self.status(rdzvd, job),
                                                      rdzvd.log()[-2000:]))

    def test_a_reset_stream_on_a_live_connection_is_not_a_lost_agent(self):
        with Rdzvd() as rdzvd:
            conns, streams = self.running_job(rdzvd, "reset")
            conns[1].send(frame(RST_STREAM, 0, streams[1], struct.pack(">I", CANCEL)))
            time.sleep(1)
            out = self.status(rdzvd, "reset")
            self.assertIn(" running ", out)
            self.assertIn("ended with its connection still up", rdzvd.log())
            # Its connection goes: now it is lost, at once.
            closed = time.monotonic()
            close(conns[1])
            lost = self.wait_for(rdzvd, "reset", " ended ")
            self.assertLess(lost - closed, 1.0, self.status(rdzvd, "reset"))
            conns[0].close()

    def test_an_agent_that_does_not_come_back_is_lost_in_time(self):
        with Rdzvd() as rdzvd:
            conns, streams = self.running_job(rdzvd, "gone")
            reset = time.monotonic()
            conns[1].send(frame(RST_STREAM, 0, streams[1], struct.pack(">I", CANCEL)))
            lost = self.wait_for(rdzvd, "gone", " ended ")
            # rdzvd's reattach window is 2 s.
            self.assertGreater(lost - reset, 1.5)
            self.assertLess(lost - reset, 4.0)
            for conn in conns:
                conn.close()

    def test_a_closed_connection_is_a_lost_agent_at_once(self):
        with Rdzvd() as rdzvd:
            conns, _ = self.running_job(rdzvd, "closed")
            closed = time.monotonic()
            close(conns[1])
            lost = self.wait_for(rdzvd, "closed", " ended ")
            self.assertLess(lost - closed, 1.0)
            conns[0].close()


if __name__ == "__main__":
    unittest.main()
