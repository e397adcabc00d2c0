#!/usr/bin/env python3
"""docs/flags.md is made from the --help of rdzv-agent, rdzvd and rdzvctl, so that it cannot
drift from what the programs accept.

  tests/flags_doc.py            # check: exit 1 with the difference when the page is stale
  tests/flags_doc.py --write    # write the page from the programs' --help

The programs come from RDZV_AGENT_BIN, RDZVD_BIN and RDZVCTL_BIN (ctest sets them; flags_doc_test),
else from build/release."""
import difflib
import os
import re
import subprocess
import sys

SOURCE_DIR = os.environ.get(
    "RDZV_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(SOURCE_DIR, "docs", "flags.md")
BUILD = os.path.join(SOURCE_DIR, "build", "release")
PROGRAMS = [
    ("rdzv-agent", "RDZV_AGENT_BIN", "client/agent/rdzv-agent"),
    ("rdzvd", "RDZVD_BIN", "server/rdzvd"),
    ("rdzvctl", "RDZVCTL_BIN", "client/ctl/rdzvctl"),
]

PREAMBLE = """\
# Flags

Every flag of `rdzv-agent`, `rdzvd` and `rdzvctl`, as their `--help` gives it (this page is made
from it by `tests/flags_doc.py --write`, and a test fails when the two differ).

Every flag with a variable can also be set with that variable in the environment, or for a whole
site in `/etc/rdzv.conf` (`NAME=value` lines; `RDZV_CONFIG` names another file). The command line
wins over the environment, which wins over the file. `torchrun` spellings such as
`--nproc_per_node` are accepted by `rdzv-agent`. A duration takes a unit (`30s`, `10m`, `1h`) or
is seconds (`30`).

Bad input gets one line naming the problem and the fix, and exit code 2, for example:

    rdzv-agent: SLURM_TASKS_PER_NODE="2(x3" is malformed (missing ')'); expected e.g. 2(x3),1
    rdzv-agent: --nnodes is required with --rdzv-endpoint (how many agents to wait for)

What the flags do in context: [launching](launching.md), [failures](failures.md),
[security and limits](security.md), [operating rdzvd](operating.md).
"""

FLAGS_HEADER = "Flags (each also settable through its variable):"
FLAG_LINE = re.compile(r"^  (--\S+)(?: ([^ ].*?))?(?:  \[([A-Z0-9_]+)\])?$")


def cell(text):
    return text.replace("|", "\\|")


def section(name, help_text):
    """One program's part of the page: its usage as --help says it, then a table of its flags."""
    head, sep, flags = help_text.partition(FLAGS_HEADER)
    if not sep:
        raise SystemExit(f"{name} --help has no line {FLAGS_HEADER!r}")
    out = [f"## {name}", "", "```", head.strip("\n"), "```", "",
           "| Flag | Variable | Meaning |", "|---|---|---|"]
    rows = []
    for line in flags.strip("\n").split("\n"):
        if not line.strip():
            continue
        match = FLAG_LINE.match(line)
        if match:
            flag, value, var = match.groups()
            rows.append([f"{flag} {value}" if value else flag, var or "", []])
        elif line.startswith("      ") and rows:
            rows[-1][2].append(line.strip())
        else:
            raise SystemExit(f"{name} --help: cannot read the line {line!r}")
    for flag, var, words in rows:
        variable = f"`{var}`" if var else ""
        out.append(f"| `{cell(flag)}` | {variable} | {cell(' '.join(words))} |")
    return out


def make_page():
    lines = [PREAMBLE.rstrip("\n")]
    for name, variable, default in PROGRAMS:
        binary = os.environ.get(variable) or os.path.join(BUILD, default)
        done = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, RDZV_CONFIG=os.devnull))
        if done.returncode != 0:
            raise SystemExit(f"{binary} --help exited {done.returncode}: {done.stderr.strip()}")
        lines += [""] + section(name, done.stdout)
    return "\n".join(lines) + "\n"


def main():
    page = make_page()
    if sys.argv[1:] == ["--write"]:
        with open(PAGE, "w") as f:
            f.write(page)
        return 0
    try:
        with open(PAGE) as f:
            current = f.read()
    except FileNotFoundError:
        current = ""
    if current == page:
        print(f"{PAGE} matches the programs' --help")
        return 0
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), page.splitlines(True),
                                               PAGE, "from --help"))
    print(f"\n{PAGE} differs from the programs' --help: run tests/flags_doc.py --write")
    return 1


if __name__ == "__main__":
    sys.exit(main())
