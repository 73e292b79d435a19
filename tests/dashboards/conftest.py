"""The server the dashboard tests scrape: one `sluice serve` on free loopback ports, on a config
with a policy of every kind that exports metrics (memory coordinators, throttler probes that need
no database), driven with a little traffic before its /metrics is read.

The binary comes from $SLUICE_BIN (default: this checkout's test-default build).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO / "build" / "test-default" / "apps" / "sluice" / "sluice"

# Every kind the server serves, each with the options that make it export all its families:
# a rate policy on a coordinator (the shared-rate families), one in shadow
# (sluice_shadow_denied_total), a concurrency policy with a queue and per-tenant series, a
# federated policy with a regional pool (the pool and outage families), an envoy_ratelimit
# policy with shared limits, a throttler on probes that need no database (one of them failing)
# and a cascade with breakers.
CONFIG = """\
policies:
  api-rate: {kind: rate, strategy: gcra, limit: 5, period: 1s, burst: 2}
  shared-rate: {kind: rate, strategy: fixed-window, limit: 5, period: 1s, coordinator: memory}
  shadow-rate: {kind: rate, strategy: fixed-window, limit: 1, period: 1s, shadow: true}
  search: {kind: adaptive, algorithm: gradient2, max_limit: 50}
  small: {kind: adaptive, algorithm: fixed, limit: 2, rate: api-rate}
  inventory: {kind: fleet, algorithm: vegas, heartbeat: 200ms}
  gateway:
    kind: concurrency
    metrics: {per_tenant: true}
    tenants:
      - {id: acme, global_concurrency_limit: 5}
      - {id: acme-team, parent: acme}
    upstreams:
      - id: llm
        host: llm.internal
        owner: acme
        concurrency_limit:
          sharing: inherit
          max_concurrent: 2
          per_tenant_max: 2
          strategy: queue
          queue: {max_depth: 2, timeout: 100ms}
    bindings:
      - {tenant: acme-team, upstream: llm}
  api-global: {kind: federated, region: eu-west, limit: 10, window: 60s, batch: 4,
               coordinator: memory}
  api-pooled: {kind: federated, region: eu-west, limit: 10, window: 60s, batch: 4,
               coordinator: memory, regional_escrow: memory, outage: regional-only}
  db:
    kind: throttler
    fast_interval: 100ms
    metrics:
      load: {probe: loadavg, threshold: 1000}
      depth: {probe: command, command: "echo 7", threshold: 5}
      broken: {probe: command, command: "exit 3", threshold: 5}   # a failing probe
      search: {probe: policy, policy: search, threshold: 0.9}
  replicas:
    kind: cascade
    nodes:
      db-1: {algorithm: fixed, limit: 2}
      db-2: {algorithm: fixed, limit: 2}
    breaker: {failures: 2, open_for: 5s}
  edge: {kind: envoy_ratelimit, config: RLS_LOCAL}
  edge-shared: {kind: envoy_ratelimit, config: RLS_SHARED, coordinator: memory}
"""

RLS_RULES = """\
domain: {domain}
descriptors:
  - key: user
    rate_limit: {{unit: second, requests_per_unit: 3}}
"""

# The kinds CONFIG holds: every kind the server has.
KINDS = ("rate", "adaptive", "fleet", "concurrency", "federated", "throttler", "cascade",
         "envoy_ratelimit")

# The server dies with the test process (util-linux's setpriv sets the parent-death signal).
_SETPRIV = shutil.which("setpriv")
_GUARD: List[str] = [_SETPRIV, "--pdeathsig", "KILL", "--"] if _SETPRIV else []


def sluice_bin() -> str:
    return os.environ.get("SLUICE_BIN") or str(DEFAULT_BIN)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: Optional[subprocess.Popen] = None
        self.http_port = 0
        self.held: List[str] = []  # leases the traffic left held, released before SIGTERM
        self.log_path = workdir / "sluice.log"
        for name, domain in (("rls-local", "edge"), ("rls-shared", "shared")):
            (workdir / name).mkdir()
            (workdir / name / "rules.yaml").write_text(RLS_RULES.format(domain=domain))
        self.config_path = workdir / "all-kinds.yaml"
        self.config_path.write_text(
            CONFIG.replace("RLS_LOCAL", str(workdir / "rls-local"))
            .replace("RLS_SHARED", str(workdir / "rls-shared")))

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> None:
        binary = sluice_bin()
        if not os.access(binary, os.X_OK):
            pytest.fail(f"sluice binary not found or not executable: {binary} (set SLUICE_BIN)")
        for _ in range(3):  # a port picked free may be taken before the server binds it
            grpc_port, self.http_port = free_port(), free_port()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    _GUARD + [binary, "serve", "--config", str(self.config_path),
                              "--grpc", f"127.0.0.1:{grpc_port}",
                              "--http", f"127.0.0.1:{self.http_port}"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.get("/healthz")[0] == 200:
                        return
                except OSError:
                    pass
                time.sleep(0.02)
            self.stop()
        pytest.fail(f"sluice serve did not become healthy; its log:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for lease in self.held:  # SIGTERM waits for held leases (server.shutdown_grace)
            self.post("/v1/release", {"lease_id": lease})
        self.held.clear()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def get(self, path: str) -> Tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, body: dict) -> Tuple[int, dict]:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, {"raw": raw.decode(errors="replace")}

    def traffic(self) -> Dict[str, List[int]]:
        """A little of everything: allowed and refused checks, admits held, released and refused,
        a queue that times out, cascade calls that fail, throttler checks, Envoy requests. Returns
        the statuses seen per call, for the fixture's sanity checks."""
        seen: Dict[str, List[int]] = {}

        def note(what: str, status: int) -> None:
            seen.setdefault(what, []).append(status)

        for policy in ("api-rate", "shared-rate", "shadow-rate"):
            for _ in range(7):
                note(policy, self.post("/v1/check", {"policy": policy, "key": "alice"})[0])
        for policy in ("api-global", "api-pooled"):
            for _ in range(12):
                note(policy, self.post("/v1/check", {"policy": policy, "key": "k"})[0])
        leases = []
        for policy, key in (("search", "s"), ("small", "a"), ("small", "b"), ("small", "c"),
                            ("inventory", "i")):
            status, body = self.post("/v1/admit", {"policy": policy, "key": key})
            note(policy, status)
            if status == 200:
                leases.append(body["lease_id"])
        for _ in range(3):  # two slots on the upstream, then a wait that times out
            status, body = self.post("/v1/admit", {"policy": "gateway", "tenant": "acme-team",
                                                   "upstream": "llm", "max_wait_ms": 30})
            note("gateway", status)
            if status == 200:
                leases.append(body["lease_id"])
        for _ in range(6):
            status, body = self.post("/v1/admit", {"policy": "replicas", "key": "x"})
            note("replicas", status)
            if status == 200:
                outcome = "failed" if body.get("chosen") == "db-1" else "success"
                self.post("/v1/release", {"lease_id": body["lease_id"], "outcome": outcome,
                                          "rtt_ms": 2})
        self.held = leases[:1]  # the first (search) stays held: something in flight
        for lease in leases[1:]:
            note("release", self.post("/v1/release", {"lease_id": lease, "rtt_ms": 3})[0])
        for app in ("gh-ost", "purge"):
            for _ in range(2):
                note("throttler", self.get(f"/throttler/check?app={app}")[0])
        for domain in ("edge", "shared", "unknown"):
            for _ in range(4):
                note("rls", self.post("/json", {"domain": domain, "descriptors": [
                    {"entries": [{"key": "user", "value": "u"}]}]})[0])
        return seen


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    s = Server(tmp_path_factory.mktemp("sluice"))
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def scrape(server: Server) -> str:
    """/metrics after the traffic, once the throttler's probes have sampled every metric and the
    fleet guard has had its first heartbeat answered."""
    seen = server.traffic()
    assert 429 in seen["api-rate"] and 200 in seen["api-rate"], seen
    assert 429 in seen["api-global"], seen
    assert 503 in seen["gateway"], seen  # the queue's wait ran out
    deadline = time.monotonic() + 8
    while True:
        status, body = server.get("/metrics")
        assert status == 200
        text = body.decode()
        if (text.count("sluice_throttler_metric_value{") >= 4
                and 'sluice_fleet_phase{policy="inventory",phase="active"}' in text):
            return text
        if time.monotonic() > deadline:
            pytest.fail("the throttler's samples or the fleet's first heartbeat never showed in "
                        f"/metrics:\n{text}\nserver log:\n{server.log()}")
        server.get("/throttler/check?app=gh-ost")  # keeps the probes on their fast interval
        time.sleep(0.1)
