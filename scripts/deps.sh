#!/usr/bin/env bash
# deps.sh: install the Debian packages sluice builds and tests with, if any are missing.
# Sourced or run by scripts/run.sh and scripts/test.sh; safe to run again (installs only what
# is absent). Needs root on Debian 12 (bookworm).
set -euo pipefail

SLUICE_BUILD_PACKAGES=(
  cmake ninja-build g++ ccache pkg-config git clang-format
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  nlohmann-json3-dev libcli11-dev prometheus-cpp-dev libfmt-dev spin
  libhiredis-dev redis-server redis-tools libpq-dev postgresql postgresql-client libyaml-cpp-dev
  libmariadb-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libboost-dev
  python3-grpcio python3-protobuf python3-pytest wrk curl
  faketime nftables iproute2
  clang libclang-rt-14-dev
)

# What only the tests need (scripts/test.sh installs them; the README's first command does not):
# a MariaDB server, started by the throttler's suite as a primary and a replica on loopback, and
# etcd (server and etcdctl), started by the etcd coordinators' tests as clusters on loopback;
# Chromium and Node.js, for the /ui page's browser test (npm comes with some builds of nodejs,
# and on its own otherwise: sluice_install_npm); pyte, the terminal emulator `sluice top`'s test
# reads its screen with; debhelper, dpkg-dev and systemd (systemd-analyze), for the Debian
# package's test; prometheus (promtool) and python3-yaml, for the dashboard and rules' test;
# what the Python client's install test builds its wheel with (venv, setuptools, wheel, build)
# and the frameworks its adapters are tested in (Flask, Starlette on uvicorn).
# shellcheck disable=SC2034  # read by scripts/test.sh, which sources this file
SLUICE_TEST_PACKAGES=(mariadb-server mariadb-client etcd-server etcd-client chromium nodejs
  python3-pyte debhelper dpkg-dev systemd adduser prometheus python3-yaml
  python3-venv python3-setuptools python3-wheel python3-build python3-flask python3-starlette
  python3-uvicorn)

sluice_missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

sluice_install_packages() {
  local missing
  missing=$(sluice_missing_packages "$@")
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "deps.sh: missing packages (run as root to install them): $missing" >&2
    return 1
  fi
  echo "deps.sh: installing:" $missing
  apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# npm: part of some nodejs packages (NodeSource's), a package of its own in Debian's.
sluice_install_npm() {
  command -v npm >/dev/null 2>&1 || sluice_install_packages npm
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  sluice_install_packages "${SLUICE_BUILD_PACKAGES[@]}"
fi
