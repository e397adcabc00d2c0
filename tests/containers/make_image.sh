#!/usr/bin/env bash
# A foreign container image for the container tests, made by debootstrap from Debian's archive
# with Debian's own python3-torch (gloo). It stands in for an image someone else built (NGC's,
# pytorch/pytorch): nothing of rdzv is in it. Two suites:
#   bullseye  Debian 11: glibc 2.31, Python 3.9, torch 1.7 (older libraries than the build's)
#   trixie    Debian 13: glibc 2.41, Python 3.13, torch 2.6 (today's torch; built without libuv)
#
#   tests/containers/make_image.sh [SUITE] [DIR]   # as root; prints DIR when it is ready
#
# SUITE defaults to bullseye. DIR defaults to $RDZV_TEST_IMAGE_DIR for bullseye, else
# /var/cache/rdzv-test-images/SUITE-torch. Built once (bullseye about 2 minutes and 1.1 GB,
# trixie about 4 minutes and 1.5 GB) and kept: a later call finds DIR/.rdzv-image-ready and
# returns at once. Calls at the same time wait for one another (flock). A failed build leaves no
# DIR behind.
#
# Also made in the image: the mount points the container tests bind into (/opt/rdzv for the
# agent, /etc/hosts, /etc/hostname, /etc/resolv.conf), as enroot's x-create would on its
# writable overlay; the tests' runtimes mount the image read-only.
set -euo pipefail

suite=bullseye
case ${1:-} in
  bullseye | trixie) suite=$1; shift ;;
  */*) ;;
  ?*) echo "make_image: unknown suite '$1'; expected bullseye or trixie (or a DIR with a /)" >&2
    exit 2 ;;
esac
default_dir=/var/cache/rdzv-test-images/$suite-torch
[ "$suite" = bullseye ] && default_dir=${RDZV_TEST_IMAGE_DIR:-$default_dir}
dir=${1:-$default_dir}
mirror=${RDZV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3-torch pulls OpenCV and GTK, whose dconf-service depends on "a D-Bus session bus",
# which debootstrap does not resolve by itself: dbus-x11 provides one.
packages=python3,python3-torch,dbus-x11

if [ "$(id -u)" != 0 ]; then
  echo "make_image: needs root (debootstrap); run it as root" >&2
  exit 1
fi
for tool in debootstrap bwrap; do
  command -v $tool >/dev/null ||
    { echo "make_image: $tool is missing: apt-get install debootstrap bubblewrap" >&2; exit 1; }
done

ready=$dir/.rdzv-image-ready
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock -w 900 9 || { echo "make_image: another build of $dir has held its lock for 15 minutes" >&2; exit 1; }
if [ -f "$ready" ]; then
  echo "$dir"
  exit 0
fi

rm -rf "$dir" "$dir.partial"
log=$(mktemp /tmp/rdzv-make-image.XXXXXX)
trap 'rm -f "$log"' EXIT
echo "make_image: debootstrap $suite ($packages) into $dir, a few minutes" >&2
start=$(date +%s)
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$dir.partial" "$mirror" \
    >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  [ -f "$dir.partial/debootstrap/debootstrap.log" ] && tail -n 30 "$dir.partial/debootstrap/debootstrap.log" >&2
  rm -rf "$dir.partial"
  echo "make_image: debootstrap failed (is $mirror reachable?)" >&2
  exit 1
fi
in_image() { bwrap --ro-bind "$1" / --proc /proc --dev /dev --tmpfs /tmp -- "${@:2}"; }
if ! in_image "$dir.partial" python3 -c 'import torch.distributed as d; assert d.is_gloo_available()'; then
  rm -rf "$dir.partial"
  echo "make_image: the image's torch has no gloo" >&2
  exit 1
fi
rm -rf "$dir.partial/var/cache/apt/archives/"*.deb
mkdir -p "$dir.partial/opt/rdzv"
for f in etc/hosts etc/hostname etc/resolv.conf; do touch "$dir.partial/$f"; done
mv "$dir.partial" "$dir"
in_image "$dir" sh -c '. /etc/os-release; echo "$PRETTY_NAME, $(ldd --version | head -1), python $(python3 -c "import platform; print(platform.python_version())"), torch $(python3 -c "import torch; print(torch.__version__)")"' \
  >"$ready"
echo "make_image: $(cat "$ready") in $(($(date +%s) - start)) s" >&2
echo "$dir"
