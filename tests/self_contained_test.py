#!/usr/bin/env python3
"""The self-contained rdzv-agent and rdzvctl (cmake/self_contained.cmake) as a user of a
container gets them: statically linked and stripped, and running where the host build cannot:
in a root file system holding nothing but them, and in a foreign image (Debian 11, glibc 2.31,
tests/containers/make_image.sh) whose name service configuration names modules the binary must
not load. Real rdzvd and agents on loopback; bubblewrap makes the roots.

Environment (ctest sets it): RDZV_CONTAINER_DIR (the build's container/ folder),
RDZV_CONTAINER_DEBUG_DIR, RDZV_TEST_IMAGE, RDZV_AGENT_BIN, RDZVD_BIN."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

CONTAINER_DIR = os.environ.get("RDZV_CONTAINER_DIR", "")
DEBUG_DIR = os.environ.get("RDZV_CONTAINER_DEBUG_DIR", "")
IMAGE = os.environ.get("RDZV_TEST_IMAGE", "")
HOST_AGENT = os.environ.get("RDZV_AGENT_BIN", "")
RDZVD = os.environ.get("RDZVD_BIN", "")
BWRAP = shutil.which("bwrap")
VERSION_RE = r"^rdzv-agent \d+\.\d+\.\d+$"


def setUpModule():
    problems = []
    for name, path in (("RDZV_CONTAINER_DIR", CONTAINER_DIR), ("RDZV_TEST_IMAGE", IMAGE)):
        if not path or not os.path.isdir(path):
            problems.append(f"{name}={path!r} is not a folder (ctest sets it)")
    if BWRAP is None:
        problems.append("bwrap is missing: apt-get install bubblewrap (deploy/install-deps.sh)")
    if os.geteuid() != 0:
        problems.append("bwrap needs root here to mount a root file system")
    if problems:
        raise RuntimeError("cannot run the self-contained tests: " + "; ".join(problems))


def readelf(*args):
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True,
                          text=True).stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ArtifactTest(unittest.TestCase):
    def test_static_and_stripped_with_debug_info_apart(self):
        for name in ("rdzv-agent", "rdzvctl"):
            with self.subTest(binary=name):
                path = os.path.join(CONTAINER_DIR, name)
                self.assertTrue(os.access(path, os.X_OK), path)
                # No program interpreter and no shared library: nothing for an image to supply.
                self.assertNotIn("INTERP", readelf("-l", path))
                self.assertNotIn("(NEEDED)", readelf("-d", path))
                sections = readelf("-S", path)
                self.assertNotIn(".symtab", sections)
                self.assertNotIn(".debug_info", sections)
                self.assertIn(".gnu_debuglink", sections)
                debug = os.path.join(DEBUG_DIR, name + ".debug")
                self.assertIn(".debug_info", readelf("-S", debug))
                print(f"{name}: {os.path.getsize(path) / 2**20:.1f} MiB "
                      f"(debug info apart: {os.path.getsize(debug) / 2**20:.1f} MiB)")


class InRootTest(unittest.TestCase):
    """Runs commands in a root made with bwrap: ROOT read-only (None: an empty tmpfs), the
    artifacts at /opt/rdzv, the host's network and PID namespace."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="rdzv-self-contained-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.procs = []
        self.addCleanup(self.stop_all)

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def bwrap(self, root, command, binds=(), tools=CONTAINER_DIR):
        argv = [BWRAP]
        if root is None:
            argv += ["--tmpfs", "/"]
        else:
            argv += ["--ro-bind", root, "/"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--die-with-parent"]
        if root is None:
            argv += ["--dir", "/opt/rdzv"]
        argv += ["--ro-bind", tools, "/opt/rdzv"]
        for src, dst in binds:
            argv += ["--ro-bind", src, dst]
        return argv + ["--"] + command

    def run_in(self, root, command, binds=(), tools=CONTAINER_DIR, timeout=60):
        return subprocess.run(self.bwrap(root, command, binds, tools), capture_output=True,
                              text=True, timeout=timeout,
                              env=dict(os.environ, RDZV_CONFIG="/dev/null"))

    def test_runs_in_an_empty_root(self):
        # Not even a libc: the workers are rdzvctl itself.
        r = self.run_in(None, ["/opt/rdzv/rdzv-agent", "--standalone", "--nproc-per-node", "2",
                               "--", "/opt/rdzv/rdzvctl", "--version"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(r.stdout.splitlines()), ["[0]: rdzvctl 0.1.0", "[1]: rdzvctl 0.1.0"],
                         r.stderr)
        self.assertIn("all 2 workers", r.stderr)

    def test_the_host_build_cannot_start_in_the_foreign_image(self):
        # What the self-contained build is for: the host's shared libraries are not there.
        r = self.run_in(IMAGE, ["/opt/rdzv/rdzv-agent", "--version"],
                        tools=os.path.dirname(HOST_AGENT))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("error while loading shared libraries", r.stderr)
        r = self.run_in(IMAGE, ["/opt/rdzv/rdzv-agent", "--version"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout.strip(), VERSION_RE)

    def test_joins_an_rdzvd_named_in_the_images_hosts_file_whatever_its_nsswitch(self):
        # The image's nsswitch.conf names NSS modules that a statically linked glibc would load
        # from the image: hesiod and compat are the image's own (glibc 2.31), and loading one
        # aborts the process (_dl_call_libc_early_init: Assertion `sym != NULL' failed). The
        # binary looks names up in /etc/hosts and DNS alone.
        port = free_port()
        log = open(os.path.join(self.tmp, "rdzvd.log"), "w")
        self.addCleanup(log.close)
        rdzvd = subprocess.Popen([RDZVD, "--listen", f"127.0.0.1:{port}", "--auth", "none"],
                                 stdout=log, stderr=subprocess.STDOUT, env=dict(
                                     os.environ, RDZV_CONFIG="/dev/null"))
        self.procs.append(rdzvd)
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                self.assertLess(time.monotonic(), deadline, "rdzvd did not listen")
                time.sleep(0.05)
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n127.0.0.1 rendezvous-head.cluster.example\n")
        nsswitch = os.path.join(self.tmp, "nsswitch.conf")
        with open(nsswitch, "w") as f:
            f.write("passwd: compat sss files\ngroup: compat sss files\n"
                    "hosts: hesiod mymachines files dns\n"
                    "services: hesiod files\nprotocols: db files\n")
        binds = [(hosts, "/etc/hosts"), (nsswitch, "/etc/nsswitch.conf")]
        agents = []
        for node in range(2):
            agents.append(subprocess.Popen(
                self.bwrap(IMAGE, [
                    "/opt/rdzv/rdzv-agent", "--rdzv-endpoint",
                    f"rendezvous-head.cluster.example:{port}", "--rdzv-id", "nss", "--nnodes",
                    "2", "--node-rank", str(node), "--nproc-per-node", "2", "--join-timeout",
                    "60", "--", "python3", "-c",
                    "import os, sys, torch; print(os.environ['RANK'], os.environ['WORLD_SIZE'],"
                    " sys.version_info[:2], torch.__version__)"], binds),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=dict(os.environ, RDZV_CONFIG="/dev/null")))
        self.procs.extend(agents)
        outputs = []
        for a in agents:
            out, err = a.communicate(timeout=120)
            self.assertEqual(a.returncode, 0, f"stdout:\n{out}\nstderr:\n{err}")
            outputs.append(out)
        ranks = sorted(int(m.group(1)) for m in re.finditer(
            r"(?m)^\[\d+\]: (\d+) 4 \(3, 9\) 1\.7", "".join(outputs)))
        self.assertEqual(ranks, [0, 1, 2, 3], outputs)


if __name__ == "__main__":
    unittest.main()
