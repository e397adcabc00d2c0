#!/usr/bin/env python3
"""rdzv-agent started once per "node" by Open MPI's mpirun (two agents on this host) against a
real rdzvd on loopback: the agents take their node rank and count from mpirun's variables, so
the job needs no --nnodes, --node-rank or --rdzv-id. Inputs: RDZV_AGENT_BIN, RDZVD_BIN."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

AGENT = os.environ.get("RDZV_AGENT_BIN", "")
RDZVD = os.environ.get("RDZVD_BIN", "")
WORKER = """import json, os, sys
e = os.environ
record = {k: e[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK",
                            "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
# mpirun's place of the agent (its rank among mpirun's processes) is not the worker's.
record["launcher"] = sorted(k for k in e if k.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_")))
with open(os.path.join(sys.argv[1], "rank-%s.json" % e["RANK"]), "w") as f:
    json.dump(record, f)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "PMI_", "RDZV_"))} | {
                "RDZV_CONFIG": os.devnull}


class MpirunTest(unittest.TestCase):
    def setUp(self):
        self.assertTrue(shutil.which("mpirun"), "mpirun not found; install openmpi-bin")
        self.tmp = tempfile.mkdtemp(prefix="rdzv-mpirun-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        port = free_port()
        self.endpoint = f"127.0.0.1:{port}"
        self.rdzvd = subprocess.Popen([RDZVD, "--auth", "none", "--listen", self.endpoint], env=clean_env(),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(self.stop_rdzvd)
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                self.assertIsNone(self.rdzvd.poll(), "rdzvd exited")
                self.assertLess(time.monotonic(), deadline, "rdzvd did not listen")
                time.sleep(0.05)

    def stop_rdzvd(self):
        self.rdzvd.terminate()
        self.rdzvd.wait(timeout=20)

    def test_two_agents_one_job(self):
        worker = os.path.join(self.tmp, "worker.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        out_dir = os.path.join(self.tmp, "out")
        os.mkdir(out_dir)
        argv = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", AGENT,
                "--rdzv-endpoint", self.endpoint, "--nproc-per-node", "2", "--",
                sys.executable, worker, out_dir]
        proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True,
                              timeout=120, start_new_session=True)
        self.assertEqual(proc.returncode, 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        table = []
        for name in sorted(os.listdir(out_dir)):
            with open(os.path.join(out_dir, name)) as f:
                table.append(json.load(f))
        run_ids = {r.pop("TORCHELASTIC_RUN_ID") for r in table}
        self.assertEqual(len(run_ids), 1, run_ids)
        self.assertRegex(run_ids.pop(), r"^mpi-\S+$")
        expected = [{"RANK": str(r), "LOCAL_RANK": str(r % 2), "WORLD_SIZE": "4",
                     "GROUP_RANK": str(r // 2), "GROUP_WORLD_SIZE": "2", "launcher": []}
                    for r in range(4)]
        self.assertEqual(sorted(table, key=lambda r: int(r["RANK"])), expected)


if __name__ == "__main__":
    unittest.main()
