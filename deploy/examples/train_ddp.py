#!/usr/bin/env python3
"""A tiny DistributedDataParallel job over gloo, launched by rdzv-agent (or torchrun).

Everything comes from the environment the launcher sets: init_process_group("env://") reads
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. The script trains a small linear model for a
few steps on data generated from a fixed seed, checks with an all_reduce that every rank sees
the same world, and checks that DDP kept the replicas identical. Rank 0 prints the final loss.

  rdzv-agent --standalone --nproc-per-node 2 -- python3 train_ddp.py --steps 20
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--fail-rank", type=int, default=-1,
                        help="this rank exits with --fail-code after the first step (for tests)")
    parser.add_argument("--fail-code", type=int, default=3)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    node = int(os.environ.get("GROUP_RANK", "0"))

    dist.init_process_group("gloo", init_method="env://")
    assert dist.get_rank() == rank and dist.get_world_size() == world

    # Every rank contributes its rank: the sum proves all of 0..world-1 are present once.
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    expected = world * (world - 1) / 2
    world_ok = total.item() == expected
    print(f"rank {rank}/{world} local {local_rank}/{local_world} node {node} "
          f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
          f"all_reduce {'ok' if world_ok else 'MISMATCH'} ({total.item():g} == {expected:g})",
          flush=True)

    torch.manual_seed(1234)
    true_w = torch.randn(8, 1)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(rank)  # each rank its own shard of the data
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        x = torch.randn(args.batch, 8, generator=gen)
        y = x @ true_w
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step == 0 and rank == args.fail_rank:
            print(f"rank {rank} failing on purpose with exit code {args.fail_code}",
                  file=sys.stderr, flush=True)
            os._exit(args.fail_code)

    # DDP averages gradients, so the replicas must still agree bit for bit.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = flat.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    low = flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    replicas_ok = torch.equal(spread, low)

    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= world
    if rank == 0:
        print(f"final loss {mean_loss.item():.6f} after {args.steps} steps on {world} ranks; "
              f"replicas {'identical' if replicas_ok else 'DIVERGED'}", flush=True)
    dist.destroy_process_group()
    return 0 if world_ok and replicas_ok else 1


if __name__ == "__main__":
    sys.exit(main())
