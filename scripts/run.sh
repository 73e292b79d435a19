#!/usr/bin/env bash
# run.sh: the main job, from a fresh Debian 12 machine (run as root).
#
# Installs missing packages, builds the sluice executable and the Python client's stubs
# (Release, in build/release) and runs the server, `sluice serve`, on the embedded default config
# (config/default.yaml; no external server): gRPC on 127.0.0.1:7070, HTTP on 127.0.0.1:8080, until
# Ctrl-C or SIGTERM. Arguments are passed to sluice serve (e.g. --config FILE, --grpc HOST:PORT,
# --http HOST:PORT). Warnings never stop this build; SLUICE_WERROR=ON (what CI sets) makes them
# errors.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=deps.sh
source "$root/scripts/deps.sh"
sluice_install_packages "${SLUICE_BUILD_PACKAGES[@]}"
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache} CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
build="$root/build/release"
mkdir -p "$root/build"
# The same configure as bench/README.md's (only the executable and the stubs are built here), so
# either one after the other finds the build directory configured as it wants it.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=ON -DSLUICE_WERROR="${SLUICE_WERROR:-OFF}" \
  >"$root/build/release.configure.log" 2>&1 || { cat "$root/build/release.configure.log"; exit 1; }
cmake --build "$build" --target sluice_cli sluice_python_stubs -j "$(nproc)" \
  >"$root/build/release.build.log" 2>&1 \
  || { tail -n 60 "$root/build/release.build.log"; exit 1; }
exec "$build/apps/sluice/sluice" serve "$@"
