#!/usr/bin/python3
"""soak.py: `sluice serve` under steady load for minutes, its clients killed at random.

    /usr/bin/python3 scripts/soak.py [--minutes 10] [--workers 8] [--sluice BIN] [--report FILE]

Not part of CI (it takes ten minutes); docs/soak.md is one run's report. It builds nothing: the
binary and the generated Python stubs come from a build (default build/test-default).

What runs: one server on free loopback ports (its config below: a GCRA rate policy, a fixed
concurrency limit of 40 chained to it, a short lease TTL so killed clients' leases expire
quickly). Worker processes of five threads each, every thread a loop of gRPC Admit (held
20-80 ms, then Release), gRPC Check and CheckMany, and the same over the HTTP JSON mirror: seven
workers keep the concurrency policy 80-90% full (the report gives the measured mean). Every
few seconds one worker is SIGKILLed in the middle of whatever it holds and a fresh one takes its
place.

What it checks, and reports:
- the server's resident memory (VmRSS) sampled every 5 s stays flat: the mean of the last quarter
  of the run is within 10% (and 8 MiB) of the mean of the second quarter;
- the server never exits, and answers throughout;
- after the load stops and one lease TTL passes, no lease is held and every policy's in-flight
  is 0: every lease a killed client held was reclaimed;
- the expired-lease counter accounts for the kills (at least one expiry per kill that held one).
Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import http.client
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEASE_TTL_S = 2

CONFIG = f"""
server:
  lease_ttl: {LEASE_TTL_S}s
  max_lease_ttl: 10s
  shutdown_grace: 2s
policies:
  soak-rate:
    kind: rate
    strategy: gcra
    limit: 100000
    period: 1s
  pool:
    kind: adaptive
    algorithm: fixed
    limit: 40
    rate: soak-rate
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def http_json(port: int, method: str, path: str, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if data and data[:1] in b"{[" else data)
    finally:
        conn.close()


def worker(grpc_target: str, http_port: int, seed: int, threads: int = 5) -> None:
    """Runs until killed: `threads` loops that admit and release, and check, over gRPC and
    HTTP."""
    import threading

    loops = [threading.Thread(target=loop, args=(grpc_target, http_port, seed * 100 + i),
                              daemon=True) for i in range(threads)]
    for t in loops:
        t.start()
    for t in loops:
        t.join()


def loop(grpc_target: str, http_port: int, seed: int) -> None:
    from sluice_client import Client, Refused, SluiceError

    rng = random.Random(seed)
    client = Client(grpc_target, timeout=5)
    n = 0
    while True:
        n += 1
        key = f"k{rng.randrange(10000)}"
        try:
            if n % 4 == 0:  # the HTTP mirror
                status, body = http_json(http_port, "POST", "/v1/admit",
                                         {"policy": "pool", "key": key})
                if status == 200:
                    time.sleep(rng.uniform(0.02, 0.08))
                    http_json(http_port, "POST", "/v1/release", {"lease_id": body["lease_id"]})
                http_json(http_port, "POST", "/v1/check", {"policy": "soak-rate", "key": key})
            else:
                try:
                    lease = client.admit("pool", key=key)
                    time.sleep(rng.uniform(0.02, 0.08))
                    client.release(lease)
                except (Refused, SluiceError):
                    pass  # refused (the pool is full): that is the load working
                client.check("soak-rate", key)
                client.check_many([("soak-rate", key), ("soak-rate", key + "x")])
        except (OSError, Refused, SluiceError):
            time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--workers", type=int, default=7)
    ap.add_argument("--kill-every", type=float, default=3.0, help="seconds between kills")
    ap.add_argument("--sluice", default=str(REPO / "build/test-default/apps/sluice/sluice"))
    ap.add_argument("--stubs", default=str(REPO / "build/test-default/clients/python/gen"))
    ap.add_argument("--report", default="", help="write a markdown report here")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path[:0] = [args.stubs, str(REPO / "clients/python")]
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return 0

    from sluice_client import Client

    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"sluice-soak-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "soak.yaml").write_text(CONFIG)
    grpc_port, http_port = free_port(), free_port()
    log = open(tmp / "server.log", "wb")
    server = subprocess.Popen([args.sluice, "serve", "--config", str(tmp / "soak.yaml"),
                               "--grpc", f"127.0.0.1:{grpc_port}",
                               "--http", f"127.0.0.1:{http_port}"],
                              stdout=subprocess.DEVNULL, stderr=log)
    target = f"127.0.0.1:{grpc_port}"
    client = Client(target, timeout=5)
    client.wait_ready(timeout=15)

    env = dict(os.environ, PYTHONPATH=f"{args.stubs}:{REPO / 'clients/python'}")
    seq = 0

    def spawn():
        nonlocal seq
        seq += 1
        return subprocess.Popen([sys.executable, __file__, "--stubs", args.stubs,
                                 "--worker", target, str(http_port), str(seq)], env=env)

    workers = [spawn() for _ in range(args.workers)]
    start = time.monotonic()
    end = start + args.minutes * 60
    next_kill = start + args.kill_every
    next_sample = start
    samples = []  # (seconds, rss KiB, leases, pool in-flight)
    kills = 0
    failures = []
    while time.monotonic() < end:
        now = time.monotonic()
        if server.poll() is not None:
            failures.append(f"the server exited with {server.returncode}")
            break
        if now >= next_kill:
            victim = random.randrange(len(workers))
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait()
            workers[victim] = spawn()
            kills += 1
            next_kill = now + args.kill_every
        if now >= next_sample:
            try:
                p = client.policies()
                samples.append((now - start, rss_kib(server.pid), p.leases, p["pool"].in_flight))
            except Exception as e:  # noqa: BLE001 - a failed sample is a finding
                failures.append(f"sample at {now - start:.0f}s failed: {e}")
            next_sample = now + 5
        time.sleep(0.05)
    for w in workers:
        w.send_signal(signal.SIGKILL)
        w.wait()

    # Every lease a killed client held expires within a TTL (plus the sweeper's tick).
    time.sleep(LEASE_TTL_S + 1.5)
    p = client.policies()
    status, _ = http_json(http_port, "GET", "/healthz")
    metrics = http_json(http_port, "GET", "/metrics")[1].decode()
    expired = next((float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("sluice_leases_expired_total")), 0.0)
    if p.leases != 0:
        failures.append(f"{p.leases} lease(s) still held after the load stopped")
    for name in p:
        if p[name].in_flight != 0:
            failures.append(f"policy {name}: {p[name].in_flight} in flight after the load stopped")
    if status != 200:
        failures.append(f"/healthz answered {status}")
    rss = [s[1] for s in samples]
    q = max(1, len(rss) // 4)
    second_quarter = sum(rss[q:2 * q]) / max(1, len(rss[q:2 * q]))
    last_quarter = sum(rss[-q:]) / q
    growth = last_quarter - second_quarter
    if growth > max(0.10 * second_quarter, 8 * 1024):
        failures.append(f"RSS grew from {second_quarter / 1024:.1f} MiB to "
                        f"{last_quarter / 1024:.1f} MiB")
    client.close()
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=10)
    if code != 0:
        failures.append(f"SIGTERM: exit {code}")

    lines = [
        f"- duration: {args.minutes:g} min, {args.workers} worker processes, "
        f"one SIGKILLed every {args.kill_every:g} s ({kills} kills)",
        f"- server RSS: start {rss[0] / 1024:.1f} MiB, second quarter mean "
        f"{second_quarter / 1024:.1f} MiB, last quarter mean {last_quarter / 1024:.1f} MiB, "
        f"max {max(rss) / 1024:.1f} MiB",
        f"- pool in flight (limit 40) at the samples: mean "
        f"{sum(s[3] for s in samples) / len(samples):.1f}, max {max(s[3] for s in samples)}",
        f"- leases expired (held by killed clients): {expired:.0f}",
        f"- after the load: {p.leases} leases held, in flight "
        + ", ".join(f"{n} {p[n].in_flight}" for n in p) + f"; /healthz {status}; "
        f"SIGTERM exit {code}",
        f"- result: {'PASSED' if not failures else 'FAILED: ' + '; '.join(failures)}",
    ]
    table = ["| t (s) | RSS (MiB) | leases | pool in flight |", "|---:|---:|---:|---:|"]
    table += [f"| {t:.0f} | {r / 1024:.1f} | {l} | {f} |" for t, r, l, f in samples[::6]]
    print("\n".join(lines))
    if args.report:
        Path(args.report).write_text("\n".join(lines) + "\n\nSamples (every 30 s):\n\n"
                                     + "\n".join(table) + "\n")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
