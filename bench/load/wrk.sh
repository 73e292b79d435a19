#!/usr/bin/env bash
# wrk.sh SLUICE [SECONDS] [HTTP_LOAD]: HTTP throughput of `sluice serve` with wrk, on loopback.
#
# Starts the server (one HTTP thread) on free ports with a rate policy that never denies, then
# runs wrk (2 threads, 16 connections, keep-alive) against GET /healthz (the floor: Beast with
# no work behind it), GET /metrics (every policy's series rendered per scrape) and POST
# /v1/check (a JSON Check); then, with 32 connections as a fleet of gh-ost migrations would
# keep open, GET /throttler/check against /healthz at 32 connections; and, with HTTP_LOAD
# (bench/load/http_load.cpp) given, HEAD /throttler/check against GET /healthz measured by it
# the same way (wrk cannot: it waits for the body a HEAD's Content-Length announces). Prints
# requests/s and each one's ratio to its floor. The server is stopped by its pid.
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
floor=$(run healthz "$base/healthz")
metrics=$(run metrics "$base/metrics")
check=$(run check -s "$dir/check.lua" "$base")
floor32=$(CONNECTIONS=32 run healthz32 "$base/healthz")
get32=$(CONNECTIONS=32 run throttler_get "$base/throttler/check?app=gh-ost")
rows=("$floor" "$metrics" "$check" "$floor32" "$get32")
load() {  # load NAME METHOD TARGET: prints "NAME req/s non-2xx" (http_load, 32 connections)
  local out
  out=$("${load_cpu[@]}" "$http_load" "127.0.0.1:$http" "$2" "$3" --connections 32 --threads 2 \
    --seconds "$seconds")
  echo "$1 $(awk '{print $2, $4}' <<<"$out")"
}
if [ -n "$http_load" ]; then
  lfloor=$(load load_healthz GET /healthz)
  rows+=("$lfloor" "$(load load_head HEAD '/throttler/check?app=gh-ost')")
  lf=$(awk '{print $2}' <<<"$lfloor")
fi
f=$(awk '{print $2}' <<<"$floor")
f32=$(awk '{print $2}' <<<"$floor32")
printf '%-36s %12s %8s %8s\n' endpoint "requests/s" "/floor" "non-2xx"
for line in "${rows[@]}"; do
  read -r name rps bad <<<"$line"
  base_rps=$f
  case $name in
    healthz) label="GET /healthz (floor)";;
    metrics) label="GET /metrics";;
    check) label="POST /v1/check (JSON)";;
    healthz32) label="GET /healthz, 32 conns (floor)"; base_rps=$f32;;
    throttler_get) label="GET /throttler/check, 32 conns"; base_rps=$f32;;
    load_healthz) label="http_load: GET /healthz (floor)"; base_rps=$lf;;
    load_head) label="http_load: HEAD /throttler/check"; base_rps=$lf;;
  esac
  printf '%-36s %12.0f %7.2fx %8s\n' "$label" "$rps" "$(awk -v a="$rps" -v b="$base_rps" 'BEGIN {print a/b}')" "$bad"
  [ "$bad" = 0 ] || status=1
done
exit "${status:-0}"
