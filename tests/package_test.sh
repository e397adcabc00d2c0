#!/usr/bin/env bash
# The Debian packages as a user gets them: builds the .debs with cpack from a release build,
# installs them with dpkg, builds deploy/examples/custom_launcher.cc out of the tree against the
# installed librdzv (CMake's find_package(rdzv), shared and static, and pkg-config), runs two
# launchers of one 2-node job against the installed /usr/bin/rdzvd, checks their ranks, and
# always stops rdzvd and purges the packages again (trap), leaving nothing installed or running.
#
#   tests/package_test.sh BUILD_DIR        # as root; ctest -L package
#
# Exits 77 (skipped) when not root. Refuses to run, and touches nothing, when any of the
# packages or their files are already on the machine.
set -euo pipefail

source_dir=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$(cd "${1:?usage: package_test.sh BUILD_DIR}" && pwd)
packages=(rdzv-tools rdzvd librdzv-dev)

if [ "$(id -u)" != 0 ]; then
  echo "package_test: needs root (dpkg -i); run it as root, or leave out ctest's label package"
  exit 77
fi

# One run at a time on this machine: dpkg has one lock and /usr/bin one rdzvd.
exec 9>/tmp/rdzv-package-test.lock
flock -w 600 9

for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'installed\|unpacked\|config-files' >/dev/null; then
    echo "package_test: package $p is already on this machine; remove it first: dpkg --purge $p"
    exit 1
  fi
done
for f in /usr/bin/rdzvd /usr/bin/rdzv-agent /usr/bin/rdzvctl /etc/rdzv.conf /usr/include/rdzv \
    /usr/lib/rdzv /usr/share/rdzv; do
  if [ -e "$f" ]; then
    echo "package_test: $f exists and would be overwritten; move it away first"
    exit 1
  fi
done

work=$(mktemp -d /tmp/rdzv-package-test.XXXXXX)
rdzvd_pid=
cleanup() {
  local rc=$?
  if [ -n "$rdzvd_pid" ] && kill -0 "$rdzvd_pid" 2>/dev/null; then
    kill -TERM "$rdzvd_pid" 2>/dev/null || true
    wait "$rdzvd_pid" 2>/dev/null || true
  fi
  dpkg --purge "${packages[@]}" >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; rc=1; }
  for p in "${packages[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'installed\|unpacked\|config-files' >/dev/null; then
      echo "FAIL: package $p is still installed after dpkg --purge"
      rc=1
    fi
  done
  for f in /usr/bin/rdzvd /usr/bin/rdzv-agent /usr/bin/rdzvctl /etc/rdzv.conf /usr/include/rdzv \
      /usr/lib/rdzv /usr/share/rdzv; do
    if [ -e "$f" ]; then
      echo "FAIL: $f is still there after dpkg --purge"
      rc=1
    fi
  done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
  echo "FAIL: $*"
  exit 1
}

echo "== cpack in $build_dir"
cpack --config "$build_dir/CPackConfig.cmake" -B "$work/debs" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack failed"; }
debs=()
for p in "${packages[@]}"; do
  deb=$(ls "$work/debs/${p}_"*.deb 2>/dev/null) || fail "cpack made no ${p}_*.deb"
  debs+=("$deb")
  echo "$(basename "$deb"): $(stat -c %s "$deb") bytes"
  dpkg-deb -f "$deb" Package Version Depends
done

echo "== dpkg -i"
dpkg -i "${debs[@]}" || fail "dpkg -i failed (missing dependencies?)"

for f in /usr/bin/rdzvd /usr/bin/rdzv-agent /usr/bin/rdzvctl; do
  [ -x "$f" ] || fail "$f is not installed"
done
unit=/usr/lib/systemd/system/rdzvd.service
grep -q '^ExecStart=/usr/bin/rdzvd ' "$unit" || fail "$unit does not start /usr/bin/rdzvd"
# The site configuration is a valid example that sets nothing: the agent still starts with it.
/usr/bin/rdzv-agent --version >/dev/null || fail "rdzv-agent does not run with the packaged /etc/rdzv.conf"
ldconfig -p | grep 'librdzv.so.0 ' >/dev/null || fail "librdzv.so.0 is not in the dynamic linker's cache"

# The self-contained agent and rdzvctl, for bind-mounting into containers: static, stripped,
# the package asking nothing for them, and running in a root that holds nothing else.
for f in /usr/lib/rdzv/container/rdzv-agent /usr/lib/rdzv/container/rdzvctl; do
  [ -x "$f" ] || fail "$f is not installed"
  if readelf -lW "$f" | grep -q INTERP; then fail "$f is not statically linked"; fi
  if readelf -SW "$f" | grep -q '\.symtab'; then fail "$f is not stripped"; fi
  echo "$f: $(stat -c %s "$f") bytes"
done
[ -f /usr/share/rdzv/enroot-workers.conf ] || fail "/usr/share/rdzv/enroot-workers.conf is not installed"
bwrap --tmpfs / --ro-bind /usr/lib/rdzv/container /opt/rdzv --proc /proc --dev /dev --tmpfs /tmp \
  -- /opt/rdzv/rdzv-agent --standalone -- /opt/rdzv/rdzvctl --version >"$work/empty-root.out" 2>&1 ||
  { cat "$work/empty-root.out"; fail "the installed self-contained agent does not run in an empty root"; }
grep -q '^\[0\]: rdzvctl ' "$work/empty-root.out" ||
  { cat "$work/empty-root.out"; fail "the installed self-contained agent ran no worker"; }

# Out of the tree: a copy of the example and its CMakeLists, nothing else from the source tree,
# and a clean environment.
clean_env=(env -i PATH=/usr/bin:/bin HOME="$work")
mkdir -p "$work/src/out-of-tree"
cp "$source_dir/deploy/examples/custom_launcher.cc" "$work/src/"
cp "$source_dir/deploy/examples/out-of-tree/CMakeLists.txt" "$work/src/out-of-tree/"
echo "== find_package(rdzv) build"
"${clean_env[@]}" cmake -S "$work/src/out-of-tree" -B "$work/cmake-build" >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; fail "configuring the out-of-tree example failed"; }
"${clean_env[@]}" cmake --build "$work/cmake-build" -j 2 >>"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; fail "building the out-of-tree example failed"; }
shared_launcher=$work/cmake-build/custom_launcher
static_launcher=$work/cmake-build/custom_launcher_static
ldd "$shared_launcher" | grep -E 'librdzv\.so\.0 => (/usr)?/lib/' >/dev/null ||
  { ldd "$shared_launcher"; fail "custom_launcher does not load the installed librdzv.so.0"; }
if ldd "$static_launcher" | grep librdzv >/dev/null; then
  fail "custom_launcher_static loads librdzv.so instead of linking librdzv.a"
fi

echo "== pkg-config build"
pc_launcher=$work/custom_launcher_pc
# shellcheck disable=SC2046
"${clean_env[@]}" g++ -std=c++20 -o "$pc_launcher" "$work/src/custom_launcher.cc" \
  $(pkg-config --cflags --libs rdzv) || fail "building with pkg-config --cflags --libs rdzv failed"
ldd "$pc_launcher" | grep -E 'librdzv\.so\.0 => (/usr)?/lib/' >/dev/null || fail "the pkg-config build does not load librdzv.so.0"

echo "== /usr/bin/rdzvd"
/usr/bin/rdzvd --auth none --listen 127.0.0.1:0 >"$work/rdzvd.log" 2>&1 &
rdzvd_pid=$!
port=
for _ in $(seq 100); do
  port=$(sed -n 's/.*serving on .* (port \([0-9]*\)).*/\1/p' "$work/rdzvd.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$rdzvd_pid" 2>/dev/null || { cat "$work/rdzvd.log"; fail "rdzvd exited"; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/rdzvd.log"; fail "rdzvd did not start serving"; }
/usr/bin/rdzvctl --rdzv-endpoint "127.0.0.1:$port" health ||
  fail "rdzvctl health against rdzvd failed"

# Runs one 2-node job of 2 processes per node with LAUNCHER0 and LAUNCHER1 and checks that each
# exits 0 and that together they hold ranks 0..3 of 4 with one master.
run_job() {
  local job=$1 l0=$2 l1=$3
  timeout 60 "$l0" "127.0.0.1:$port" "$job" 2 0 2 >"$work/$job.0" 2>&1 &
  local pid0=$!
  timeout 60 "$l1" "127.0.0.1:$port" "$job" 2 1 2 >"$work/$job.1" 2>&1 &
  local pid1=$!
  local rc0=0 rc1=0
  wait "$pid0" || rc0=$?
  wait "$pid1" || rc1=$?
  cat "$work/$job.0" "$work/$job.1"
  [ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "job $job: launchers exited $rc0 and $rc1"
  local ranks masters
  ranks=$(sed -n 's/^node \([0-9]*\)\/2 ranks \([0-9]*\.\.[0-9]*\) of 4 .*/\1:\2/p' \
    "$work/$job.0" "$work/$job.1" | sort | tr '\n' ' ')
  [ "$ranks" = "0:0..1 1:2..3 " ] || fail "job $job: ranks \"$ranks\", expected node 0 0..1 and node 1 2..3"
  masters=$(sed -n 's/.* master \(.*\)$/\1/p' "$work/$job.0" "$work/$job.1" | sort -u | wc -l)
  [ "$masters" = 1 ] || fail "job $job: the launchers were told different masters"
  echo "job $job: ok"
}
run_job cmake-shared "$shared_launcher" "$shared_launcher"
run_job static-and-pkg-config "$static_launcher" "$pc_launcher"

kill -TERM "$rdzvd_pid"
wait "$rdzvd_pid" || fail "rdzvd did not exit 0 on SIGTERM"
rdzvd_pid=
echo "package_test: passed"
