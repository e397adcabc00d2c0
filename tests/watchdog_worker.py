"""A training loop for the watchdog tests: DDP-style steps over gloo, each inside torch's
file timer and (with --heartbeat) preceded by an rdzv heartbeat. --hang-rank R makes rank R
stop at step 2 (--hang-step): inside its timer, before its heartbeat, while the others block in all_reduce.
--depth N makes it stop N calls deep. --race-lag L makes the ranks agree on one moment for the
hang step's deadlines: the hung rank's timer expires then, the others' L seconds later, so that
their agents find their hangs at nearly the same time.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic import timer

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-step", type=int, default=2)
parser.add_argument("--heartbeat", action="store_true")
parser.add_argument("--first-attempt-only", action="store_true")
parser.add_argument("--noise", action="store_true",
                    help="also write a malformed line and an expired timer of another process")
parser.add_argument("--depth", type=int, default=0)
parser.add_argument("--race-lag", type=float, default=None)
parser.add_argument("--handshake", default="",
                    help="write DIR/fifo-RANK (the timer file's path), then wait for DIR/go")
parser.add_argument("--marker", default="")
args = parser.parse_args()

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
fifo = os.open(os.environ["TORCHELASTIC_TIMER_FILE"], os.O_WRONLY | os.O_NONBLOCK)

if args.handshake:
    named = os.path.join(args.handshake, f"fifo-{rank}")
    with open(named + ".tmp", "w") as f:
        f.write(os.environ["TORCHELASTIC_TIMER_FILE"])
    os.rename(named + ".tmp", named)
    waited = time.monotonic()
    while not os.path.exists(os.path.join(args.handshake, "go")):
        if time.monotonic() - waited > 120:
            raise SystemExit(f"rank {rank}: {args.handshake}/go never appeared")
        time.sleep(0.1)


if args.noise:
    os.write(fifo, b"this is not a request\n")
    os.write(fifo, b'{"version": 1, "pid": 1, "scope_id": "x", "expiration_time": 1, "signal": 9}\n')


def heartbeat():
    os.write(fifo, f'{{"version": 1, "pid": {os.getpid()}, "heartbeat": true}}\n'.encode())


def stuck():
    time.sleep(600)


def deep(calls):
    if calls == 0:
        stuck()
    else:
        deep(calls - 1)


hangs = rank == args.hang_rank and not (
    args.first_attempt_only and os.environ["TORCHELASTIC_RESTART_COUNT"] != "0")
t = torch.ones(1)
for step in range(args.steps):
    if args.race_lag is not None and step == args.hang_step:
        deadline = torch.tensor([time.time() + 2.0], dtype=torch.float64)
        dist.all_reduce(deadline, op=dist.ReduceOp.MAX)
        if hangs:
            with timer.expires(after=deadline.item() - time.time(), scope="step"):
                deep(args.depth)
        with timer.expires(after=deadline.item() + args.race_lag - time.time(), scope="step"):
            dist.all_reduce(t)
        continue
    if hangs and step == args.hang_step:
        if args.heartbeat:
            stuck()
        with timer.expires(after=2, scope="step"):
            deep(args.depth)
    time.sleep(0.5)  # loading the next batch
    if args.heartbeat:
        heartbeat()
    with timer.expires(after=10 if args.heartbeat else 2, scope="step"):
        dist.all_reduce(t)
print(f"rank {rank} finished {args.steps} steps (restart "
      f"{os.environ['TORCHELASTIC_RESTART_COUNT']})", flush=True)
