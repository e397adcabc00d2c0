#!/usr/bin/python3
"""Plots rdzvd's memory, CPU per agent and time to every assignment against the agents of a job.

Usage: /usr/bin/python3 tests/bench/plot_scale.py BENCH.csv [BENCH.csv ...]
           [-o docs/rendezvous-100k.png]

Each BENCH.csv is `rdzv-bench --csv` output; the rows are told apart by how their agents reached
rdzvd: each on a stream of its own (direct), through a tree's relays (--fan-in, real relays or
--simulated-children), or as per-task launches (--tasks-per-node, one group join per node).
Medians over the repetitions of each N are drawn, next to two published anchors for the time to
start a job: PyTorch's TCPStore with its libuv backend (about 100 s for 96K ranks) and Slurm (30 s
to launch 30,000 tasks on 15,000 nodes). Also prints the medians as a Markdown table.
"""

import argparse
import csv
import statistics
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (label, style) by how the agents reached rdzvd.
SERIES = {
    "direct": ("each agent its own stream", "o-", "tab:blue"),
    "tree-simulated": ("tree of 64, relays' children simulated", "s-", "tab:green"),
    "tree-relays": ("tree of 64, real relays", "D--", "tab:olive"),
    "per-task": ("per task, 8 per node, a group join per node", "^-", "tab:purple"),
}
ANCHORS = [
    (96_000, 100.0, "PyTorch TCPStore (libuv): 96K ranks", "tab:red", "v"),
    (30_000, 30.0, "Slurm: 30,000 tasks on 15,000 nodes", "tab:orange", "P"),
]


def series_of(row):
    """The series of `row`, or None for --compare tasks' one-agent-per-node side (its baseline)."""
    if row["variant"] == "tasks=1":
        return None
    if int(row["tasks_per_node"]) > 1:
        return "per-task"
    if int(row.get("fan_in") or 0) > 0:
        return "tree-simulated" if row["variant"] == "simulated-children" else "tree-relays"
    return "direct"


def load(paths):
    """{series: {agents: {column: [values]}}}"""
    data = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                name = series_of(row)
                if name is None:
                    continue
                agents = int(row["n"]) * int(row["tasks_per_node"])
                point = data[name][agents]
                point["hwm_mib"].append(float(row["hwm_mib"]))
                point["rss_mib"].append(float(row["rss_attached_mib"]))
                point["cpu_ms"].append(1000.0 * float(row["rdzvd_cpu_join_s"]) / agents)
                point["rdzv_s"].append(float(row["join_wall_s"]))
                point["floor_s"].append(float(row["floor_wall_s"]))
                point["abort_s"].append(float(row["abort_s"]))
                point["streams"].append(float(row["streams"] or "nan"))
                point["errors"].append(int(row["errors"]))
    return data


def median(values):
    return statistics.median(values)


def print_table(data):
    print("| agents | how | rdzvd streams | rdzvd RSS (peak) | rdzvd CPU per agent | "
          "every assignment | floor | abort to all | errors | reps |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, points in data.items():
        for agents, p in points.items():
            rows.append((agents, list(SERIES).index(name), name, p))
    for agents, _, name, p in sorted(rows):
        streams = median(p["streams"])
        print(f"| {agents:,} | {name} | {'—' if streams != streams else f'{streams:,.0f}'} | "
              f"{median(p['rss_mib']):.0f} MiB ({median(p['hwm_mib']):.0f}) | "
              f"{median(p['cpu_ms']):.3f} ms | {median(p['rdzv_s']):.2f} s | "
              f"{median(p['floor_s']):.2f} s | {median(p['abort_s']):.2f} s | "
              f"{sum(p['errors'])} | {len(p['rdzv_s'])} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_csv", nargs="+")
    ap.add_argument("-o", "--output", default="docs/rendezvous-100k.png")
    args = ap.parse_args()
    data = load(args.bench_csv)
    print_table(data)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6), dpi=110)
    panels = [
        ("hwm_mib", "rdzvd peak RSS (MiB)", False),
        ("cpu_ms", "rdzvd CPU per agent (ms)", True),
        ("rdzv_s", "until every agent holds its assignment (s)", True),
    ]
    for ax, (key, title, log_y) in zip(axes, panels):
        for name, (label, style, color) in SERIES.items():
            if name not in data:
                continue
            ns = sorted(data[name])
            ax.plot(ns, [median(data[name][n][key]) for n in ns], style, color=color, label=label)
        if key == "rdzv_s":
            for agents, seconds, label, color, marker in ANCHORS:
                ax.plot([agents], [seconds], marker, color=color, markersize=9, label=label)
        ax.set_xscale("log")
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("agents in the job")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].axhline(200, color="gray", linestyle=":", linewidth=1)
    axes[0].text(1000, 205, "200 MiB", color="gray", fontsize=8)
    handles, labels = [], []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.suptitle("rdzvd from 1,000 to 100,000 agents, one 2-core machine, loopback", fontsize=11)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    fig.savefig(args.output)


if __name__ == "__main__":
    main()
