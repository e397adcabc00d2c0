#!/usr/bin/env python3
"""A training loop that checkpoints on SIGUSR1 and resumes from its checkpoint on start.

The worker's half of deploy/slurm/ddp-requeue.sbatch: when the job nears its time limit, Slurm
signals the batch script, which passes SIGUSR1 through srun and rdzv-agent to every worker.
This script then finishes its current step, saves a checkpoint, and exits 0; the batch script
requeues the job, and the next run picks up where this one stopped.

  CHECKPOINT_DIR=/shared/ckpt rdzv-agent --standalone --nproc-per-node 2 -- \\
      python3 checkpoint_demo.py --steps 100

Standard library only, so that it runs anywhere. Each rank keeps its own state in
CHECKPOINT_DIR/rank-RANK.json. A real DDP job would agree on the step to stop at (all_reduce
the "stop" flag at the end of each step, so that no rank waits in a collective for one that
stopped), let rank 0 save the model and optimizer with torch.save, and have every rank load it.
"""
import argparse
import json
import os
import signal
import sys
import time

stop_requested = False


def on_usr1(signum, frame):
    # Only note it: the checkpoint is written between steps, not in the middle of one.
    global stop_requested
    stop_requested = True


def save(path, state):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # a run killed mid-write leaves the previous checkpoint intact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps in the whole training")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="how long a step takes")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR", "."))
    args = parser.parse_args()

    # First thing: until the handler is installed, SIGUSR1 would kill the process.
    signal.signal(signal.SIGUSR1, on_usr1)
    rank = int(os.environ.get("RANK", "0"))
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    path = os.path.join(args.checkpoint_dir, f"rank-{rank}.json")

    # The "model": a running sum of the step numbers, so that a resumed run that lost or
    # repeated a step ends with a different total.
    state = {"step": 0, "total": 0}
    if os.path.exists(path):
        with open(path) as f:
            state = json.load(f)
        print(f"rank {rank}: resumed from step {state['step']} "
              f"(restart {os.environ.get('SLURM_RESTART_COUNT', '0')})", flush=True)
    else:
        print(f"rank {rank}: starting at step 0", flush=True)

    while state["step"] < args.steps:
        if stop_requested:
            save(path, state)
            print(f"rank {rank}: checkpointed at step {state['step']}", flush=True)
            return 0
        time.sleep(args.step_seconds)  # one training step
        state["total"] += state["step"]
        state["step"] += 1
        if state["step"] % args.log_every == 0:
            print(f"rank {rank}: step {state['step']}", flush=True)

    save(path, state)
    print(f"rank {rank}: finished {args.steps} steps, total {state['total']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
