#!/usr/bin/env bash
# The test suite, from a fresh Debian 12 machine: installs what it needs, builds (release, and
# ASan+UBSan for the unit and integration tests), runs every test with ctest: unit, loopback
# integration, real PyTorch end to end, and the real local Slurm cluster (as root); then each
# libFuzzer harness for 20 s (RDZV_FUZZ_SECONDS).
#
#   deploy/run-tests.sh            # everything
#   RDZV_SKIP_ASAN=1 RDZV_SKIP_FUZZ=1 deploy/run-tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh

jobs=$(nproc)
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j 1 -LE package
# The .debs of this build installed, used and purged again (dpkg needs root).
if [ "$(id -u)" = 0 ]; then
  ctest --preset release -L package
fi

if [ "${RDZV_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$jobs"
  # The 2,000-agent scale checks (bench_*) ran in the release pass; under ASan they take minutes. The
  # attack test bounds rdzvd's memory, which ASan's shadow and quarantine multiply; it ran in the
  # release pass too.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --preset asan -L 'unit|integration' -E '^bench_|^isolation_test$' -j 1
fi

# Each libFuzzer harness for a bounded time from its corpus in tests/fuzz/corpus (clang, ASan and
# UBSan); any crash, sanitizer report, hang or leak fails the run.
if [ "${RDZV_SKIP_FUZZ:-0}" != 1 ]; then
  tests/fuzz/run.sh "${RDZV_FUZZ_SECONDS:-20}"
fi
