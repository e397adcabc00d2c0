#!/usr/bin/env bash
# The demo, from a fresh Debian 12 machine (as root): installs what it needs, builds rdzv,
# starts a real 4-node Slurm cluster on this machine, and runs real PyTorch DDP (gloo) on it
# with one line and no configuration:
#
#   srun -N3 --ntasks-per-node=1 rdzv-agent --nproc-per-node 2 -- python3 train_ddp.py
#
# Each of the 6 ranks prints its line, rank 0 prints the final loss; then the cluster stops.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

deploy/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target rdzv-agent rdzvd

trap '"$root/deploy/slurm/local-cluster.sh" stop' EXIT
deploy/slurm/local-cluster.sh start
eval "$(deploy/slurm/local-cluster.sh env)"

export PATH="$root/build/release/client/agent:$PATH"
# Debian's python3 has torch; a python3 earlier on PATH (pyenv, venv) may not.
python=/usr/bin/python3
cd /tmp
echo "+ srun -N3 --ntasks-per-node=1 rdzv-agent --nproc-per-node 2 -- python3 train_ddp.py" >&2
srun -N3 --ntasks-per-node=1 rdzv-agent --nproc-per-node 2 -- \
  "$python" "$root/deploy/examples/train_ddp.py" --steps 50
