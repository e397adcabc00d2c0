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

# Each stage's time, printed as it ends and again together at the end (also when one fails).
timings=()
stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "== $name" >&2
  "$@" || rc=$?
  timings+=("$(printf '%-22s %5d s%s' "$name" $((SECONDS - start)) "$([ $rc = 0 ] || echo "  FAILED ($rc)")")")
  echo "== $name: $((SECONDS - start)) s" >&2
  return "$rc"
}
summary() {
  if [ -n "${image_pid:-}" ]; then
    kill -- "-$image_pid" 2>/dev/null || true
    rm -f "$image_log"
  fi
  echo "== stages" >&2
  printf '   %s\n' "${timings[@]}" >&2
  echo "   total                  $SECONDS s" >&2
}
trap summary EXIT

stage install-deps deploy/install-deps.sh

# The container tests' foreign image (a debootstrap, mostly download: about 2 minutes on a new
# machine) is made while the release build runs; their fixture waits for it, or makes it.
if [ "$(id -u)" = 0 ]; then
  image_log=$(mktemp /tmp/rdzv-make-image.XXXXXX)
  setsid tests/containers/make_image.sh >"$image_log" 2>&1 &
  image_pid=$!
fi

jobs=$(nproc)
# The tests need line tables for their stack traces, not full debug information, which takes a
# third of the compile time.
cmake --preset release -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
stage release-build cmake --build --preset release -j "$jobs"
stage release-tests ctest --preset release -j 1 -LE package
# The .debs of this build installed, used and purged again (dpkg needs root).
if [ "$(id -u)" = 0 ]; then
  stage package-test ctest --preset release -L package
fi

if [ "${RDZV_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan -DCMAKE_CXX_FLAGS_DEBUG="-g1" >/dev/null
  stage asan-build cmake --build --preset asan -j "$jobs"
  # The 2,000-agent scale checks (bench_*) ran in the release pass; under ASan they take minutes. The
  # attack test bounds rdzvd's memory, which ASan's shadow and quarantine multiply; it ran in the
  # release pass too.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    stage asan-tests ctest --preset asan -L 'unit|integration' -E '^bench_|^isolation_test$' -j 1
fi

# Each libFuzzer harness for a bounded time from its corpus in tests/fuzz/corpus (clang, ASan and
# UBSan); any crash, sanitizer report, hang or leak fails the run.
if [ "${RDZV_SKIP_FUZZ:-0}" != 1 ]; then
  stage fuzz tests/fuzz/run.sh "${RDZV_FUZZ_SECONDS:-20}"
fi
