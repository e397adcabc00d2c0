#!/usr/bin/python3
"""Plots rendezvous time against agent count from rdzv-bench's CSV (log-log).

Usage: /usr/bin/python3 tests/bench/plot.py BENCH.csv [--before OLD.csv]
           [--compare COMPARE.csv] [-o docs/rendezvous-scale.png]

BENCH.csv is `rdzv-bench --csv` output: per N, the rendezvous (first join sent to last
assignment received) and the floor (the same number of fresh channels making one empty call
each), medians over repetitions. --before adds an earlier run's rendezvous and floor, dashed.
--compare takes compare_torchrun.py's CSV and adds its "N agents true" medians: real agent
processes from launch to exit, for rdzv-agent and for torchrun (c10d).
"""

import argparse
import csv
import statistics
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def medians(path, key):
    by_n = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            by_n[int(row["n"])].append(float(row[key]))
    ns = sorted(by_n)
    return ns, [statistics.median(by_n[n]) for n in ns]


def compare_points(path, tool):
    by_n = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["tool"] == tool and row["case"].endswith("agents true") and row["ok"] == "1":
                by_n[int(row["agents"])].append(float(row["wall_s"]))
    ns = sorted(by_n)
    return ns, [statistics.median(by_n[n]) for n in ns]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_csv")
    ap.add_argument("--before", help="an earlier rdzv-bench CSV, drawn dashed")
    ap.add_argument("--compare", help="compare_torchrun.py's CSV")
    ap.add_argument("-o", "--output", default="docs/rendezvous-scale.png")
    args = ap.parse_args()

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ns, rdzv = medians(args.bench_csv, "join_wall_s")
    _, floor = medians(args.bench_csv, "floor_wall_s")
    ax.plot(ns, rdzv, "o-", color="tab:blue", label="rdzvd: full rendezvous of N agents")
    ax.plot(ns, floor, "s:", color="tab:gray", label="floor: N channels, one empty call each")
    if args.before:
        bns, before = medians(args.before, "join_wall_s")
        _, before_floor = medians(args.before, "floor_wall_s")
        ax.plot(bns, before, "o--", color="tab:blue", alpha=0.45, label="rdzvd before tuning")
        ax.plot(bns, before_floor, "s--", color="tab:gray", alpha=0.45,
                label="floor before tuning")
    if args.compare:
        tns, tr = compare_points(args.compare, "torchrun")
        if tns:
            ax.plot(tns, tr, "^", color="tab:red", markersize=8,
                    label="torchrun c10d: N real agents, launch to exit")
        rns, ra = compare_points(args.compare, "rdzv")
        if rns:
            ax.plot(rns, ra, "v", color="tab:green", markersize=8,
                    label="rdzv-agent: N real agents, launch to exit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("agents (N)")
    ax.set_ylabel("seconds")
    ax.set_title("Rendezvous time on one 2-core machine, loopback")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
