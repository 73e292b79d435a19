"""Fixtures: a real `sluice serve` per test, on free loopback ports.

The binary comes from $SLUICE_BIN (default: the test-default build of this checkout); the
generated stubs (sluice.v1.sluice_pb2*) and sluice_client from PYTHONPATH.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))  # sluice_client itself, when PYTHONPATH lacks it

import sluice_client  # noqa: E402  (raises a clear ImportError when the stubs are missing)

DEFAULT_BIN = REPO / "build" / "test-default" / "apps" / "sluice" / "sluice"


def sluice_bin() -> str:
    return os.environ.get("SLUICE_BIN") or str(DEFAULT_BIN)


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.02,
               what: str = "condition"):
    """Polls `predicate` until it returns something truthy (returned) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class HttpResponse:
    def __init__(self, status: int, headers: Dict[str, str], body: bytes):
        self.status = status
        self.headers = headers  # lower-cased names
        self.body = body

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self):
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<HttpResponse {self.status} {self.body[:200]!r}>"


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> Dict[Tuple[str, frozenset], float]:
    """Prometheus text -> {(name, frozenset of (label, value)): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = frozenset(_LABEL.findall(m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(samples, name: str, **labels) -> Optional[float]:
    """The one sample of `name` whose labels include `labels` (None: no such sample)."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
    return found[0] if found else None


# A server the tests start is killed with the test process if that dies first (a crash, or a
# runner's SIGKILL on timeout): util-linux's setpriv sets the kernel's parent-death signal and
# execs the server in place (same pid). Without setpriv the servers run unguarded.
_SETPRIV = shutil.which("setpriv")
_DIE_WITH_PARENT: List[str] = [_SETPRIV, "--pdeathsig", "KILL", "--"] if _SETPRIV else []
# A file-descriptor limit is set the same way, by util-linux's prlimit: no Python runs between
# fork and exec (this process has gRPC's threads, and a forked child running Python code may wait
# forever on a lock one of them held at the fork).
_PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"


class SluiceServer:
    """One `sluice serve` process on free loopback ports, its stderr in a file."""

    def __init__(self, workdir: Path, config: Optional[str] = None, name: str = "sluice",
                 fd_limit: Optional[int] = None):
        self.workdir = workdir
        self.fd_limit = fd_limit  # RLIMIT_NOFILE (soft and hard) of the server process
        self.binary = sluice_bin()
        self.config_path: Optional[Path] = None
        if config is not None:
            self.config_path = workdir / f"{name}.yaml"
            self.config_path.write_text(config)
        self.log_path = workdir / f"{name}.stderr.log"
        self.proc: Optional[subprocess.Popen] = None
        self.grpc_port = 0
        self.http_port = 0
        self._clients: List[sluice_client.Client] = []

    # ---- lifecycle ----

    def start(self, timeout: float = 15.0) -> "SluiceServer":
        if not os.access(self.binary, os.X_OK):
            pytest.fail(f"sluice binary not found or not executable: {self.binary} "
                        f"(set SLUICE_BIN)")
        # A port picked free may be taken before the server binds it: try again then.
        for attempt in range(3):
            self.grpc_port, self.http_port = free_port(), free_port()
            limits = ([_PRLIMIT, f"--nofile={self.fd_limit}:{self.fd_limit}", "--"]
                      if self.fd_limit is not None else [])
            args = _DIE_WITH_PARENT + limits + [self.binary, "serve", "--grpc",
                                       f"127.0.0.1:{self.grpc_port}",
                                       "--http", f"127.0.0.1:{self.http_port}"]
            if self.config_path is not None:
                args += ["--config", str(self.config_path)]
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=log)
            if self._wait_ready(timeout):
                return self
            if "cannot listen" not in self.log() or attempt == 2:
                break
        self.stop()
        pytest.fail(f"sluice serve did not become ready; its log:\n{self.log()}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if "serving" in self.log():
                try:
                    if self.http("GET", "/healthz").status == 200:
                        return True
                except OSError:
                    pass
            time.sleep(0.01)
        return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.running(), "the server is not running"
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 5.0) -> Optional[int]:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        for c in self._clients:
            c.close()
        self._clients.clear()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def write_config(self, text: str) -> None:
        assert self.config_path is not None, "this server runs the embedded default config"
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config_path)

    # ---- talking to it ----

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def client(self, timeout: float = 5.0) -> sluice_client.Client:
        c = sluice_client.Client(self.grpc_target, timeout=timeout)
        self._clients.append(c)
        return c

    def http(self, method: str, path: str, body=None, headers: Optional[dict] = None,
             timeout: float = 5.0) -> HttpResponse:
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return HttpResponse(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()

    def metrics(self):
        r = self.http("GET", "/metrics")
        assert r.status == 200, r
        return parse_metrics(r.text)


@pytest.fixture
def start_server(tmp_path) -> Callable[..., SluiceServer]:
    """start_server(config_text=None) -> a running SluiceServer, stopped at teardown."""
    servers: List[SluiceServer] = []

    def start(config: Optional[str] = None, fd_limit: Optional[int] = None) -> SluiceServer:
        s = SluiceServer(tmp_path, config, name=f"sluice{len(servers)}", fd_limit=fd_limit)
        servers.append(s)
        return s.start()

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def server(start_server) -> SluiceServer:
    """A server on the embedded default config (config/default.yaml)."""
    return start_server()


@pytest.fixture
def client(server) -> sluice_client.Client:
    return server.client()


@pytest.fixture
def key() -> Callable[[], str]:
    """key() -> a fresh rate key (so no test sees another's rate state)."""
    return lambda: f"k-{uuid.uuid4().hex[:12]}"


class Redis:
    """A redis-server of its own on a free loopback port, without persistence; stopped by pid."""

    def __init__(self, workdir):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir), "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.cli("PING") == "PONG", 10, what="redis-server to answer")

    def cli(self, *args) -> str:
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
                           capture_output=True, text=True, timeout=5)
        return r.stdout.strip()

    def script_calls(self) -> int:
        """The coordinator's calls: script runs (EVALSHA, EVAL), each one request to Redis (the
        commands a script runs inside it are counted apart by INFO commandstats)."""
        total = 0
        for line in self.cli("INFO", "commandstats").splitlines():
            if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
                total += int(line.split("calls=")[1].split(",")[0])
        return total

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path)
    yield r
    r.kill()
