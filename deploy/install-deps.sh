#!/usr/bin/env bash
# Installs what building and testing rdzv needs, from Debian's packages only (Debian 12).
# Idempotent: installs nothing when everything is present. Needs root (or sudo).
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libasio-dev googletest libgtest-dev libgmock-dev
  libmunge-dev libssl-dev    # MUNGE credentials and token digests
  libcpp-httplib-dev         # rdzvd's Prometheus endpoint (--metrics-listen)
  prometheus                 # a real Prometheus scrapes rdzvd in the metrics test
  slurm-wlm munge            # a real Slurm for the demo and the tests
  python3-torch              # real PyTorch (gloo) for the examples and end-to-end tests
  openmpi-bin                # mpirun launch shape tests
  iproute2 procps
  openssl                    # the TLS test makes its own CA and certificates
  dpkg-dev file              # cpack's .deb packages (dpkg-shlibdeps) and their test
  clang libclang-rt-dev      # libFuzzer for tests/fuzz
  debootstrap bubblewrap     # the container tests' foreign image, and the runtimes standing in
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}" >&2
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
