#!/usr/bin/env bash
# memory_rate.sh [BENCH_RATE_LIMITER] [RUNS]: sluice's in-process GCRA on one hot key against
# rate-limiter-flexible's in-memory limiter (RateLimiterMemory) in the same run.
#
# Installs rate-limiter-flexible from npm into a directory of its own (build/peers: nothing is
# committed), then RUNS times (default 3), alternating: bench_rate_limiter's hot-key GCRA,
# 3 repetitions each of BM_Hot_Gcra_ClockPerCall (a check reading the steady clock, as
# rate-limiter-flexible reads its own), BM_Hot_Gcra_CoarseClockPerCall (the same on
# CLOCK_MONOTONIC_COARSE; its precision cost is stated in include/sluice/core/clock.h) and
# BM_Hot_Gcra (the clock read once per 64 checks); and bench/peers/rate_limiter_flexible_memory.js
# (consume() on one key, each promise awaited), 3 repetitions of 1 s. Prints each run's medians,
# then the median of the runs and the ratios rate-limiter-flexible / sluice (the target: >= 10x
# with a clock read per call). Both are pinned to the same CPU when taskset is there.
# Needs: a built bench_rate_limiter (default build/release/bench/bench_rate_limiter), node, npm.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bench=${1:-$root/build/release/bench/bench_rate_limiter}
runs=${2:-3}
[ -x "$bench" ] || { echo "memory_rate.sh: $bench is not built (cmake --build build/release)" >&2; exit 1; }
peers=$root/build/peers
if [ ! -d "$peers/node_modules/rate-limiter-flexible" ]; then
  mkdir -p "$peers"
  (cd "$peers" && { [ -f package.json ] || npm init -y >/dev/null; } &&
    npm install --no-audit --no-fund rate-limiter-flexible@11 >/dev/null)
fi
cpu=()
if command -v taskset >/dev/null; then cpu=(taskset -c 0); fi
echo "rate-limiter-flexible $(node -p "require('$peers/node_modules/rate-limiter-flexible/package.json').version"), node $(node --version), $bench"

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
sluice_clock=(); sluice_caller=(); sluice_coarse=(); peer=()
for r in $(seq 1 "$runs"); do
  out=$("${cpu[@]}" "$bench" --benchmark_filter='BM_Hot_Gcra_ClockPerCall/threads:1|BM_Hot_Gcra_CoarseClockPerCall/threads:1|BM_Hot_Gcra/threads:1' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true 2>/dev/null |
    sed 's/\x1b\[[0-9;]*m//g')
  clock=$(awk '$1 == "BM_Hot_Gcra_ClockPerCall/threads:1_median" {print $2}' <<<"$out")
  caller=$(awk '$1 == "BM_Hot_Gcra/threads:1_median" {print $2}' <<<"$out")
  coarse=$(awk '$1 == "BM_Hot_Gcra_CoarseClockPerCall/threads:1_median" {print $2}' <<<"$out")
  rlf=$("${cpu[@]}" env NODE_PATH="$peers/node_modules" node "$root/bench/peers/rate_limiter_flexible_memory.js" \
    --seconds 1 --repetitions 3 2>/dev/null | sed 's/.*ns_per_op=\([0-9.]*\).*/\1/' | median)
  echo "run $r: sluice GCRA hot key ${clock} ns (clock per call), ${coarse} ns (coarse clock per call), ${caller} ns (caller time); rate-limiter-flexible ${rlf} ns"
  sluice_clock+=("$clock"); sluice_caller+=("$caller"); sluice_coarse+=("$coarse"); peer+=("$rlf")
done
c=$(echo "${sluice_clock[*]}" | median); t=$(echo "${sluice_caller[*]}" | median)
k=$(echo "${sluice_coarse[*]}" | median); p=$(echo "${peer[*]}" | median)
awk -v c="$c" -v t="$t" -v k="$k" -v p="$p" 'BEGIN {
  printf "median: sluice %.1f ns (clock per call), %.1f ns (coarse clock per call), %.1f ns (caller time); rate-limiter-flexible %.1f ns\n", c, k, t, p
  printf "rate-limiter-flexible / sluice: %.1fx with the clock per call, %.1fx with the coarse clock per call (target >= 10x with a clock read), %.1fx with caller time\n", p / c, p / k, p / t
}'
