#!/usr/bin/env bash
# wrk.sh SLUICE [SECONDS]: HTTP throughput of `sluice serve` with wrk, on loopback.
#
# Starts the server (one HTTP thread) on free ports with a rate policy that never denies, then
# runs wrk (2 threads, 16 connections, keep-alive) against GET /healthz (the floor: Beast with
# no work behind it), GET /metrics (every policy's series rendered per scrape) and POST
# /v1/check (a JSON Check). Prints requests/s and each one's ratio to the floor. The server is
# stopped by its pid.
set -euo pipefail
sluice=$1
seconds=${2:-5}
dir=$(mktemp -d /tmp/sluice-wrk.XXXXXX)
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http=$(free_port); grpc=$(free_port)
cat >"$dir/config.yaml" <<YAML
policies:
  bench-rate: {kind: rate, strategy: gcra, limit: 1000000000, period: 1s}
  bench-concurrency: {kind: adaptive, algorithm: fixed, limit: 1000}
  inventory: {kind: fleet, algorithm: vegas}
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
"$sluice" serve --config "$dir/config.yaml" --grpc "127.0.0.1:$grpc" --http "127.0.0.1:$http" 2>"$dir/log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 200); do grep -q serving "$dir/log" && break; sleep 0.05; done
run() {  # run NAME wrk-args...: prints "NAME req/s"
  local name=$1; shift
  local out rps non2xx
  out=$(wrk -t2 -c16 -d"${seconds}s" "$@")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  echo "$name $rps ${non2xx:-0}"
}
base="http://127.0.0.1:$http"
floor=$(run healthz "$base/healthz")
metrics=$(run metrics "$base/metrics")
check=$(run check -s "$dir/check.lua" "$base")
f=$(awk '{print $2}' <<<"$floor")
printf '%-28s %12s %8s %8s\n' endpoint "requests/s" "/floor" "non-2xx"
for line in "$floor" "$metrics" "$check"; do
  read -r name rps bad <<<"$line"
  case $name in healthz) label="GET /healthz (floor)";; metrics) label="GET /metrics";; check) label="POST /v1/check (JSON)";; esac
  printf '%-28s %12.0f %7.2fx %8s\n' "$label" "$rps" "$(awk -v a="$rps" -v b="$f" 'BEGIN {print a/b}')" "$bad"
  [ "$bad" = 0 ] || status=1
done
exit "${status:-0}"
