#!/usr/bin/env bash
# instructions.sh: the server's instructions per call of Check and of Envoy's ShouldRateLimit,
# counted by callgrind: deterministic where a throughput figure on a shared machine is not.
#
# For each kind, `sluice_load --serve` runs under callgrind twice, answering WARMUP + N1 and
# WARMUP + N2 calls sent one at a time by `sluice_load --send`; the difference of the two
# totals over N2 - N1 is what one more call costs the server (start-up and shutdown cancel).
# The server's timer threads run for as long as a run lasts, so a figure moves by a few per
# cent from one pair to the next: each is the median of 3 pairs, all printed.
# Usage: bench/load/instructions.sh [SLUICE_LOAD] (default build/release/bench/sluice_load)
set -euo pipefail
load="${1:-build/release/bench/sluice_load}"
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is not installed" >&2; exit 1; }
[ -x "$load" ] || { echo "instructions.sh: $load: not built" >&2; exit 1; }
warmup=200 n1=1000 n2=4000
work=$(mktemp -d /tmp/sluice-instructions-XXXXXX)
trap 'rm -rf "$work"' EXIT

# Total instructions of a server that answered `calls` calls of kind $1.
total() {
  local kind=$1 calls=$2 pid port
  mkfifo "$work/in"
  valgrind --tool=callgrind --callgrind-out-file="$work/out" "$load" --serve \
    <"$work/in" >"$work/ports" 2>"$work/log" &
  pid=$!
  exec 7>"$work/in"
  for _ in $(seq 200); do [ -s "$work/ports" ] && break; sleep 0.1; done
  port=$(awk '{print $2}' "$work/ports")
  [ -n "$port" ] || { cat "$work/log" >&2; kill "$pid"; exit 1; }
  "$load" --send "$kind" "$calls" "$port"
  exec 7>&-
  wait "$pid"
  rm -f "$work/in" "$work/ports"
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$work/log"
}

declare -A per_call
for kind in check rls; do
  pairs=()
  for _ in 1 2 3; do
    a=$(total "$kind" $((warmup + n1)))
    b=$(total "$kind" $((warmup + n2)))
    pairs+=($(( (b - a) / (n2 - n1) )))
  done
  per_call[$kind]=$(printf '%s\n' "${pairs[@]}" | sort -n | sed -n 2p)
  echo "$kind: ${per_call[$kind]} instructions per call, median of ${pairs[*]} (server, callgrind)"
done
awk -v c="${per_call[check]}" -v r="${per_call[rls]}" \
  'BEGIN { printf "ShouldRateLimit / Check in calls per instruction: %.3fx\n", c / r }'
