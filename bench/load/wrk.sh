#!/usr/bin/env bash
# wrk.sh SLUICE [SECONDS] [HTTP_LOAD]: HTTP throughput of `sluice serve` with wrk, on loopback.
#
# Starts the server (one HTTP thread) on free ports with a rate policy that never denies, then
# runs wrk (2 threads, 16 connections, keep-alive) against GET /healthz (the floor: Beast with
# no work behind it), GET /metrics (every policy's series rendered per scrape) and POST
# /v1/check (a JSON Check); then, with 32 connections as a fleet of gh-ost migrations would
# keep open, GET /throttler/check against /healthz at 32 connections; and, with HTTP_LOAD
# (bench/load/http_load.cpp) given, HEAD /throttler/check against GET /healthz measured by it
# the same way (wrk cannot: it waits for the body a HEAD's Content-Length announces). With
# ROUNDS=N (default 1) every endpoint is measured N times, each against its floor in the same
# round; prints each endpoint's median requests/s, its median ratio to the floor and every
# round's ratio. The server is stopped by its pid.
set -euo pipefail
sluice=$1
seconds=${2:-5}
http_load=${3:-}
dir=$(mktemp -d /tmp/sluice-wrk.XXXXXX)
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http=$(free_port); grpc=$(free_port)
cat >"$dir/config.yaml" <<YAML
policies:
  bench-rate: {kind: rate, strategy: gcra, limit: 1000000000, period: 1s}
  bench-concurrency: {kind: adaptive, algorithm: fixed, limit: 1000}
  inventory: {kind: fleet, algorithm: vegas}
  db:
    kind: throttler
    metrics:
      load: {probe: loadavg, threshold: 100000}
      api: {probe: policy, policy: bench-concurrency, threshold: 2}
YAML
cat >"$dir/check.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, "/v1/check", nil,
                    '{"policy":"bench-rate","key":"user-' .. (counter % 1000) .. '","hits":1}')
end
LUA
# With two CPUs or more the server is pinned to one and the load to another, so neither steals
# the other's core and a ratio is the server's (it serves HTTP on one thread).
server_cpu=(); load_cpu=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  server_cpu=(taskset -c 0); load_cpu=(taskset -c 1)
fi
"${server_cpu[@]}" "$sluice" serve --config "$dir/config.yaml" --grpc "127.0.0.1:$grpc" \
  --http "127.0.0.1:$http" 2>"$dir/log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 200); do grep -q serving "$dir/log" && break; sleep 0.05; done
run() {  # run NAME wrk-args...: prints "NAME req/s" (16 connections; CONNECTIONS overrides)
  local name=$1; shift
  local out rps non2xx
  out=$("${load_cpu[@]}" wrk -t2 -c"${CONNECTIONS:-16}" -d"${seconds}s" "$@")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  echo "$name $rps ${non2xx:-0}"
}
base="http://127.0.0.1:$http"
load() {  # load NAME METHOD TARGET: prints "NAME req/s non-2xx" (http_load, 32 connections)
  local out
  out=$("${load_cpu[@]}" "$http_load" "127.0.0.1:$http" "$2" "$3" --connections 32 --threads 2 \
    --seconds "$seconds")
  echo "$1 $(awk '{print $2, $4}' <<<"$out")"
}
# One round: every endpoint once, each row "NAME req/s non-2xx floor-req/s".
round() {
  local floor metrics check floor32 get32 f f32 lfloor lf
  floor=$(run healthz "$base/healthz")
  metrics=$(run metrics "$base/metrics")
  check=$(run check -s "$dir/check.lua" "$base")
  floor32=$(CONNECTIONS=32 run healthz32 "$base/healthz")
  get32=$(CONNECTIONS=32 run throttler_get "$base/throttler/check?app=gh-ost")
  f=$(awk '{print $2}' <<<"$floor")
  f32=$(awk '{print $2}' <<<"$floor32")
  echo "$floor $f"; echo "$metrics $f"; echo "$check $f"; echo "$floor32 $f32"; echo "$get32 $f32"
  if [ -n "$http_load" ]; then
    lfloor=$(load load_healthz GET /healthz)
    lf=$(awk '{print $2}' <<<"$lfloor")
    echo "$lfloor $lf"; echo "$(load load_head HEAD '/throttler/check?app=gh-ost') $lf"
  fi
}
rounds=${ROUNDS:-1}
all=()
for r in $(seq 1 "$rounds"); do
  while read -r line; do all+=("$r $line"); done < <(round)
done
# Per endpoint: the median of its requests/s and of its ratio to the floor of the same round,
# and every round's ratio.
printf '%-36s %12s %8s %8s  %s\n' endpoint "requests/s" "/floor" "non-2xx" "ratio per round"
for name in healthz metrics check healthz32 throttler_get load_healthz load_head; do
  mapfile -t mine < <(printf '%s\n' "${all[@]}" | awk -v n="$name" '$2 == n')
  [ "${#mine[@]}" -gt 0 ] || continue
  case $name in
    healthz) label="GET /healthz (floor)";;
    metrics) label="GET /metrics";;
    check) label="POST /v1/check (JSON)";;
    healthz32) label="GET /healthz, 32 conns (floor)";;
    throttler_get) label="GET /throttler/check, 32 conns";;
    load_healthz) label="http_load: GET /healthz (floor)";;
    load_head) label="http_load: HEAD /throttler/check";;
  esac
  median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
  rps=$(printf '%s\n' "${mine[@]}" | awk '{print $3}' | median)
  ratios=$(printf '%s\n' "${mine[@]}" | awk '{printf "%.2f\n", $3 / $5}')
  ratio=$(median <<<"$ratios")
  bad=$(printf '%s\n' "${mine[@]}" | awk '{s += $4} END {print s}')
  printf '%-36s %12.0f %7.2fx %8s  %s\n' "$label" "$rps" "$ratio" "$bad" "$(paste -sd, <<<"$ratios")"
  [ "$bad" = 0 ] || status=1
done
exit "${status:-0}"
