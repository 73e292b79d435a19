#!/usr/bin/env bash
# serve_roundtrip.sh SLUICE: the README's first command (`sluice serve`, the embedded default
# config, no external server) starts, the CLI gets decisions from it, and SIGTERM stops it
# cleanly. The server binds 127.0.0.1 on free ports and is stopped by its pid.
set -uo pipefail
sluice=$1
dir=$(mktemp -d /tmp/sluice-serve.XXXXXX)
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc=$(free_port); http=$(free_port)
"$sluice" serve --grpc "127.0.0.1:$grpc" --http "127.0.0.1:$http" 2>"$dir/log" &
pid=$!
trap 'kill -KILL "$pid" 2>/dev/null; rm -rf "$dir"' EXIT  # also when ctest kills this script
fail() { echo "FAIL: $*"; echo "--- server log"; cat "$dir/log"; kill -KILL "$pid" 2>/dev/null; rm -rf "$dir"; exit 1; }
for _ in $(seq 1 200); do grep -q "serving" "$dir/log" && break; kill -0 "$pid" 2>/dev/null || fail "server exited"; sleep 0.05; done
grep -q "embedded default config" "$dir/log" || fail "not serving the embedded default"
export SLUICE_SERVER=127.0.0.1:$grpc

# Rate: per-minute allows 1000 per key per minute; api-rate bursts of 20.
out=$("$sluice" check per-minute alice -n 1000) || fail "check: exit $?: $out"
# Durations print for people: 1m, 59.5s, 250ms (not 60.000000s).
duration='[0-9]+(\.[0-9]{1,3})?(ns|us|ms|s|m|h)'
[[ $out =~ ^allowed:\ 0\ of\ 1000\ remaining\ \(full\ again\ in\ $duration\)$ ]] || fail "check said: $out"
"$sluice" check per-minute alice >"$dir/out"; rc=$?
[ "$rc" = 1 ] && grep -q "^denied: 0 of 1000 remaining; retry after" "$dir/out" || fail "the 1001st hit: rc $rc, $(cat "$dir/out")"
"$sluice" check api-rate alice -n 21 >"$dir/out"; rc=$?
[ "$rc" = 1 ] && grep -q "can never pass" "$dir/out" || fail "21 hits over a burst of 20: rc $rc, $(cat "$dir/out")"
json=$("$sluice" check api-rate alice -n 21 --json); rc=$?
[ "$rc" = 1 ] && grep -q '"retry_after_seconds":null' <<<"$json" || fail "never in JSON: rc $rc, $json"
"$sluice" peek api-rate bob -n 20 >/dev/null || fail "peek of a fresh key"
"$sluice" check nope alice 2>"$dir/err"; rc=$?
[ "$rc" = 2 ] && grep -q "(NOT_FOUND): policy: no policy named 'nope'" "$dir/err" || fail "unknown policy: rc $rc, $(cat "$dir/err")"

# Concurrency: small allows 10 in flight.
leases=()
for i in $(seq 1 10); do leases+=("$("$sluice" admit small 2>/dev/null)") || fail "admit $i"; done
"$sluice" admit small >"$dir/out" 2>&1; rc=$?
[ "$rc" = 1 ] && grep -q "refused (503" "$dir/out" || fail "11th admit: rc $rc, $(cat "$dir/out")"
table=$("$sluice" policies)
grep -Eq "^small +adaptive +10 +10 +-$" <<<"$table" || fail "policies: $table"
# A rate policy's limit is per period; a concurrency policy has no single limit.
grep -Eq "^api-rate +rate +- +100 +- +per 1s, burst 20$" <<<"$table" || fail "policies: $table"
grep -Eq "^gateway +concurrency +0 +- +api-rate +a limit per tenant, upstream" <<<"$table" || fail "policies: $table"
json=$("$sluice" heartbeat "${leases[0]}" --ttl 40s --json) || fail "heartbeat"
grep -q '"ttl_seconds":40' <<<"$json" || fail "heartbeat --json: $json"
out=$("$sluice" heartbeat "${leases[0]}" --ttl 90s) || fail "heartbeat"
[ "$out" = "lease extended: expires in 90s" ] || fail "heartbeat: $out"
"$sluice" release "${leases[0]}" --outcome dropped --rtt 20ms >/dev/null || fail "release"
"$sluice" release "${leases[0]}" 2>/dev/null; rc=$?
[ "$rc" = 2 ] || fail "a second release must fail, got $rc"
leases[0]=$("$sluice" admit small --ttl 2m 2>"$dir/err") || fail "admit after a release"
grep -q "^admitted: lease ${leases[0]} for 2m " "$dir/err" || fail "admit said: $(cat "$dir/err")"
json=$("$sluice" admit gateway -t acme-team -u llm -r chat --json) || fail "gateway admit"
grep -q '"admitted":true' <<<"$json" || fail "gateway admit: $json"
leases+=("$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["lease_id"])' <<<"$json")")
leases+=("$("$sluice" admit gateway -t acme -u llm 2>/dev/null)") || fail "gateway admit"
grep -q '"leases":12' <<<"$("$sluice" policies --json)" || fail "lease count: $("$sluice" policies --json)"

# The default config's cascade: excluding two replicas leaves the third; an overload is on its
# record as a failure.
json=$("$sluice" admit replicas -x db-1 -x db-2 --json) || fail "cascade admit"
grep -q '"chosen":"db-3"' <<<"$json" || fail "cascade admit: $json"
lease=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["lease_id"])' <<<"$json")
"$sluice" release "$lease" --outcome overload >/dev/null || fail "cascade release"
/usr/bin/python3 -c '
import json, sys
policies = json.load(sys.stdin)["policies"]
nodes = {n["name"]: n for p in policies if p["name"] == "replicas" for n in p["nodes"]}
# In whichever bucket is current when it is read (the ring moves on with time, and a slow
# machine may have passed a bucket boundary since the release).
buckets = nodes["db-3"]["buckets"]
assert sum(b["finished"] for b in buckets) == 1, nodes["db-3"]
assert sum(b["succeeded"] for b in buckets) == 0, nodes["db-3"]
assert nodes["db-3"]["weight"] == 0, nodes["db-3"]
' <<<"$("$sluice" policies --json)" || fail "cascade state: $("$sluice" policies --json)"

# HTTP: metrics and readiness.
# (read whole first: grep -q stops reading at its match, and pipefail would count curl's SIGPIPE)
metrics=$(curl -sf "http://127.0.0.1:$http/metrics") || fail "metrics: curl exit $?"
grep -q '^sluice_fleet_l_global{policy="inventory"}' <<<"$metrics" || fail "metrics: no L_global"
curl -sf "http://127.0.0.1:$http/healthz" >/dev/null || fail "healthz"

# SIGHUP with no file: logged, still serving.
kill -HUP "$pid"
for _ in $(seq 1 100); do grep -q "no file to reload" "$dir/log" && break; sleep 0.05; done
grep -q "no file to reload" "$dir/log" || fail "SIGHUP not handled"
"$sluice" check api-rate carol >/dev/null || fail "serving after SIGHUP"

# SIGTERM: drains while leases are held (Check is refused, Release still works) and exits 0
# as soon as the last lease is released.
kill -TERM "$pid"
for _ in $(seq 1 100); do grep -q "shutting down" "$dir/log" && break; sleep 0.05; done
"$sluice" check api-rate dave 2>"$dir/err"; rc=$?
[ "$rc" = 2 ] && grep -q "shutting down" "$dir/err" || fail "check while draining: rc $rc"
for l in "${leases[@]}"; do "$sluice" release "$l" >/dev/null || fail "release while draining"; done
wait "$pid"; rc=$?
[ "$rc" = 0 ] || fail "exit code $rc after SIGTERM"
grep -q "stopped" "$dir/log" || fail "no stop line"
trap - EXIT
echo "--- server log"; cat "$dir/log"
rm -rf "$dir"
echo "serve roundtrip: ok"
