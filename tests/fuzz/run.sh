#!/usr/bin/env bash
# Builds the libFuzzer harnesses (preset fuzz: clang++, ASan+UBSan) and runs each for a bounded
# time on a scratch copy of its seed corpus in tests/fuzz/corpus, so the repository is never
# written to. Prints each fuzzer's executions and coverage; exits 1 when any fuzzer found a
# crash, a sanitizer report, a leak, a hang (over 25 s on one input: a legal hostlist of a
# million names takes seconds under ASan on a busy machine) or an out-of-memory (over 2 GiB).
# What it found is kept under build/fuzz/findings/NAME/ with the fuzzer's log.
#
#   tests/fuzz/run.sh            # 30 s per fuzzer
#   tests/fuzz/run.sh 600        # 10 minutes per fuzzer
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=${1:-30}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: tests/fuzz/run.sh [SECONDS]  (time per fuzzer, default 30)" >&2
  exit 2
fi
fuzzers=(hostlist slurm_env agent_flags config rendezvous_events)
jobs=$(nproc)

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
findings=build/fuzz/findings
rm -rf "$findings"

run_one() {
  local name=$1 dict=()
  mkdir -p "$findings/$name"
  cp -r "tests/fuzz/corpus/$name" "$scratch/$name"
  [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
  local rc=0
  UBSAN_OPTIONS=print_stacktrace=1 "build/fuzz/tests/fuzz/${name}_fuzz" \
    -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$findings/$name/" "${dict[@]}" "$scratch/$name" \
    >"$findings/$name/log" 2>&1 || rc=$?
  echo "$rc" >"$scratch/$name.rc"
}

# As many fuzzers at once as there are cores.
running=0
for name in "${fuzzers[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  run_one "$name" &
  running=$((running + 1))
done
wait

failed=0
for name in "${fuzzers[@]}"; do
  log=$findings/$name/log
  rc=$(cat "$scratch/$name.rc")
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  # The last status line: "#N DONE cov: C ft: F corp: K/SIZE ...".
  status=$(grep -E '^#[0-9]+[[:space:]].* cov: ' "$log" | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$status")
  printf '%-18s %10s runs  cov %5s  features %6s  corpus %5s inputs' \
    "$name" "${runs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}"
  if [ "$rc" = 0 ]; then
    echo "  ok"
    continue
  fi
  failed=1
  echo "  FAILED (exit $rc)"
  grep -E 'property violated|ERROR: |runtime error|SUMMARY' "$log" | head -n 5 | sed 's/^/    /'
  for input in "$findings/$name"/crash-* "$findings/$name"/leak-* "$findings/$name"/timeout-* \
    "$findings/$name"/oom-*; do
    [ -e "$input" ] || continue
    echo "    input: $input (replay: build/fuzz/tests/fuzz/${name}_fuzz $input)"
  done
  echo "    log: $log"
done
exit "$failed"
