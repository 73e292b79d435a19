#!/usr/bin/env bash
# test_package.sh: the Debian package, built, installed, run and removed on this machine (root).
#   1. dpkg-buildpackage -b from a copy of the sources (debian/): with SLUICE_BIN set, of that
#      binary, built from the same sources (debian/rules, SLUICE_PREBUILT: the test suite's,
#      so that CI does not compile the project once more); without it, from source, a Release
#      build with Debian's hardening flags, through the compiler cache;
#   2. dpkg -i: the binary, the unit, /etc/sluice/sluice.yaml (a conffile), the system user;
#   3. systemd-analyze verify on the installed unit;
#   4. the installed binary validates and serves the installed config as the user sluice (on
#      free loopback ports): /readyz 200, SIGHUP reloads (config generation 2), SIGTERM drains
#      and exits 0 within the unit's TimeoutStopSec;
#   5. dpkg --purge: binary, unit, config and state gone, nothing of the package left.
# Prints "package: ..." lines; exits non-zero at the first failure (the package purged anyway).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/sluice-package.XXXXXX)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  if dpkg-query -W -f='${Status}' sluice 2>/dev/null | grep -q installed; then
    dpkg --purge sluice >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "package: FAILED: $*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then fail "needs root (dpkg -i)"; fi
if dpkg-query -W -f='${Status}' sluice 2>/dev/null | grep -q installed; then
  fail "a sluice package is installed already: this test would replace it"
fi

# 1. Build, from a copy (dpkg-buildpackage writes the .deb beside the source directory).
src="$work/sluice"
mkdir -p "$src"
tar -C "$root" --exclude=./build --exclude='./build-*' --exclude=node_modules \
    --exclude=./obj-\* --exclude=./.git -cf - . | tar -C "$src" -xf -
started=$SECONDS
(
  cd "$src"
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache} CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
  DEB_BUILD_OPTIONS="nocheck noautodbgsym parallel=$(nproc)" SLUICE_PREBUILT=${SLUICE_BIN:-} \
    dpkg-buildpackage -us -uc -b >"$work/build.log" 2>&1
) || { tail -n 40 "$work/build.log"; fail "dpkg-buildpackage"; }
deb=$(ls "$work"/sluice_*.deb)
from="from source"
[ -n "${SLUICE_BIN:-}" ] && from="of $SLUICE_BIN"
echo "package: built $(basename "$deb") in $((SECONDS - started)) s ($from)"
version=$(dpkg-deb -f "$deb" Version)
project=$(sed -nE 's/^project\(sluice VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
[ "$version" = "$project" ] || fail "package version $version is not the project's $project"
dpkg-deb -c "$deb" >"$work/contents"
for f in ./usr/bin/sluice ./lib/systemd/system/sluice.service ./etc/sluice/sluice.yaml \
         ./usr/share/doc/sluice/README.md; do
  grep -q " $f\$" "$work/contents" || fail "the package lacks $f"
done

# 2. Install.
dpkg -i "$deb" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "dpkg -i"; }
getent passwd sluice >/dev/null || fail "no system user sluice"
[ "$(getent passwd sluice | cut -d: -f7)" = /usr/sbin/nologin ] || fail "sluice has a login shell"
grep -qx /etc/sluice/sluice.yaml /var/lib/dpkg/info/sluice.conffiles ||
  fail "/etc/sluice/sluice.yaml is not a conffile"
cmp -s /etc/sluice/sluice.yaml "$root/config/default.yaml" || fail "the installed config is not the default"
echo "package: installed (user sluice, conffile /etc/sluice/sluice.yaml)"

# 3. The unit.
systemd-analyze verify /lib/systemd/system/sluice.service >"$work/verify.log" 2>&1 ||
  { cat "$work/verify.log"; fail "systemd-analyze verify"; }
[ -s "$work/verify.log" ] && { cat "$work/verify.log"; fail "systemd-analyze verify printed warnings"; }
stop_timeout=$(sed -nE 's/^TimeoutStopSec=([0-9]+)$/\1/p' /lib/systemd/system/sluice.service)
echo "package: systemd-analyze verify: clean"

# 4. Run it as the unit would (its ExecStartPre and ExecStart, as user sluice), on free ports.
setpriv --reuid=sluice --regid=sluice --init-groups -- /usr/bin/sluice validate /etc/sluice/sluice.yaml >/dev/null ||
  fail "sluice validate /etc/sluice/sluice.yaml"
ports=$(/usr/bin/python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')
read -r grpc http <<<"$ports"
setpriv --reuid=sluice --regid=sluice --init-groups -- /usr/bin/sluice serve --config /etc/sluice/sluice.yaml \
  --grpc "127.0.0.1:$grpc" --http "127.0.0.1:$http" >"$work/serve.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$http/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$http/readyz" >/dev/null || { cat "$work/serve.log"; fail "/readyz"; }
[ "$(ps -o user= -p "$server_pid")" = sluice ] || fail "the server does not run as sluice"
/usr/bin/sluice policies --server "127.0.0.1:$grpc" | grep -q '^inventory ' ||
  fail "the installed CLI does not list the installed config's policies"
kill -HUP "$server_pid"
for _ in $(seq 1 50); do
  curl -fsS "http://127.0.0.1:$http/v1/policies" | grep -q '"generation":2' && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$http/v1/policies" | grep -q '"generation":2' ||
  { cat "$work/serve.log"; fail "SIGHUP did not reload"; }
echo "package: serving as sluice, /readyz 200, SIGHUP reloaded"
kill -TERM "$server_pid"
waited=0
while kill -0 "$server_pid" 2>/dev/null; do
  sleep 0.1
  waited=$((waited + 1))
  [ "$waited" -gt $((stop_timeout * 10)) ] && fail "still running ${stop_timeout} s after SIGTERM"
done
rc=0
wait "$server_pid" || rc=$?
server_pid=""
[ "$rc" = 0 ] || { cat "$work/serve.log"; fail "exit code $rc after SIGTERM"; }
echo "package: SIGTERM: stopped in $((waited / 10)).$((waited % 10)) s, exit 0"

# 5. Remove.
dpkg --purge sluice >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "dpkg --purge"; }
for f in /usr/bin/sluice /lib/systemd/system/sluice.service /etc/sluice /var/lib/sluice; do
  [ ! -e "$f" ] || fail "$f is left after the purge"
done
dpkg-query -W -f='${Status}' sluice 2>/dev/null | grep -q installed && fail "still installed"
echo "package: purged, nothing left"
