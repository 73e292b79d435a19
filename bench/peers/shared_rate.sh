#!/usr/bin/env bash
# shared_rate.sh [SECONDS] [RUNS]: sluice's shared rate limits on Redis against
# rate-limiter-flexible's RateLimiterRedis, on the same Redis, in one run.
#
# Starts a redis-server of its own (127.0.0.1, a free port, no persistence), installs
# rate-limiter-flexible and ioredis from npm into a directory of its own (build/peers: nothing is
# committed), then runs, RUNS times each, alternating (default 3 runs of 5 s):
#   under  every check under its limit (a decision at Redis each time), 1,000 keys, 256 checks
#          in flight: sluice_shared_rate_load (a GCRA `rate` policy on a Redis coordinator, in
#          process) and bench/peers/rate_limiter_flexible.js (RateLimiterRedis.consume, its
#          fixed window script, on one ioredis connection);
#   over   every key over its limit: sluice with its refusal cache, sluice without it (a
#          decision at Redis each time), rate-limiter-flexible as it comes, and with its
#          in-memory block of refused keys (inMemoryBlockOnConsumed);
# and prints each run's decisions per second and Redis commands per decision (INFO stats'
# total_commands_processed, which counts a script's own commands too), then the medians and the
# ratios sluice / rate-limiter-flexible. Both tools are pinned to one CPU and Redis to the other
# when the machine has two (neither takes the other's core). Redis is stopped by its pid.
# Needs: build/release/bench/sluice_shared_rate_load (cmake --build build/release), node, npm.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-5}
runs=${2:-3}
load=${SLUICE_SHARED_RATE_LOAD:-$root/build/release/bench/sluice_shared_rate_load}
[ -x "$load" ] || { echo "shared_rate.sh: $load is not built (cmake --build build/release)" >&2; exit 1; }
peers=$root/build/peers
if [ ! -d "$peers/node_modules/rate-limiter-flexible" ] || [ ! -d "$peers/node_modules/ioredis" ]; then
  mkdir -p "$peers"
  (cd "$peers" && npm init -y >/dev/null && npm install --no-audit --no-fund rate-limiter-flexible@11 ioredis@5 >/dev/null)
fi
echo "rate-limiter-flexible $(node -p "require('$peers/node_modules/rate-limiter-flexible/package.json').version"), ioredis $(node -p "require('$peers/node_modules/ioredis/package.json').version"), node $(node --version), $(redis-server --version | awk '{print $3}')"
dir=$(mktemp -d /tmp/sluice-shared-rate.XXXXXX)
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis_cpu=(); tool_cpu=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  redis_cpu=(taskset -c 0); tool_cpu=(taskset -c 1)
fi
"${redis_cpu[@]}" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$dir" >"$dir/log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.05; done

field() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2}'; }
declare -A results
measure() {  # measure NAME command...: one run, recorded under NAME
  local name=$1; shift
  local out
  out=$("${tool_cpu[@]}" "$@")
  echo "  $name: $(field "$out" per_second)/s, $(field "$out" redis_commands_per_decision) Redis commands per decision"
  results[$name]+="$(field "$out" per_second) "
}
sluice_run() { measure "$1" "$load" --redis-port "$port" --seconds "$seconds" --in-flight 256 --keys 1000 "${@:2}"; }
rlflx_run() { measure "$1" env NODE_PATH="$peers/node_modules" node "$root/bench/peers/rate_limiter_flexible.js" --port "$port" --seconds "$seconds" --concurrency 256 --keys 1000 "${@:2}"; }
for r in $(seq 1 "$runs"); do
  echo "run $r"
  redis-cli -p "$port" FLUSHALL >/dev/null
  sluice_run sluice_under
  rlflx_run rlflx_under
  sluice_run sluice_over_cache --mode over
  sluice_run sluice_over_no_cache --mode over --no-cache
  rlflx_run rlflx_over --mode over
  rlflx_run rlflx_over_block --mode over --block
done
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "medians (decisions per second):"
for k in sluice_under rlflx_under sluice_over_cache sluice_over_no_cache rlflx_over rlflx_over_block; do
  echo "  $k $(median "${results[$k]}")"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2fx", a / b}'; }
echo "under the limit, sluice / rate-limiter-flexible: $(ratio "$(median "${results[sluice_under]}")" "$(median "${results[rlflx_under]}")")"
echo "over the limit, sluice with its refusal cache / rate-limiter-flexible: $(ratio "$(median "${results[sluice_over_cache]}")" "$(median "${results[rlflx_over]}")")"
echo "over the limit, sluice with its refusal cache / rate-limiter-flexible with inMemoryBlockOnConsumed: $(ratio "$(median "${results[sluice_over_cache]}")" "$(median "${results[rlflx_over_block]}")")"
echo "over the limit, sluice without its cache / rate-limiter-flexible: $(ratio "$(median "${results[sluice_over_no_cache]}")" "$(median "${results[rlflx_over]}")")"
