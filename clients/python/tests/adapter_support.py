"""What the adapters' tests (test_asgi.py, test_wsgi.py, test_grpc_interceptor.py) share: the
sluice config they run, real HTTP servers in threads (uvicorn for ASGI, werkzeug for WSGI) on
free loopback ports, and waiting for a policy's state."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Dict, Optional, Tuple

from conftest import wait_until

# rate2: 2 requests per key an hour; one: a fixed concurrency limit of 1; chained: a limit of 10
# behind rate1 (1 request per key an hour), whose refusal is a 429.
CONFIG = """\
policies:
  rate2: {kind: rate, limit: 2, period: 1h}
  rate1: {kind: rate, limit: 1, period: 1h}
  one: {kind: adaptive, algorithm: fixed, limit: 1}
  chained: {kind: adaptive, algorithm: fixed, limit: 10, rate: rate1}
"""


def closed_port_target() -> str:
    """host:port where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class Http:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def get(self, path: str, headers: Optional[dict] = None) -> Tuple[int, Dict[str, str], bytes]:
        self.conn.request("GET", path, headers=headers or {})
        r = self.conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

    def close(self) -> None:
        self.conn.close()


def get(port: int, path: str, headers: Optional[dict] = None):
    c = Http(port)
    try:
        return c.get(path, headers)
    finally:
        c.close()


def problem_of(headers: Dict[str, str], body: bytes) -> dict:
    assert headers["content-type"] == "application/problem+json", headers
    return json.loads(body)


def in_flight(client, policy: str) -> int:
    return client.policies()[policy].in_flight


def counters(client, policy: str) -> Dict[str, int]:
    """An adaptive policy's accepted, rejected, dropped and ignored counts."""
    state = client.policies()[policy].state
    return {k: state[k] for k in ("accepted", "rejected", "dropped", "ignored")}


def wait_in_flight(client, policy: str, n: int, timeout: float = 5.0) -> None:
    wait_until(lambda: in_flight(client, policy) == n, timeout,
               what=f"{policy}'s in_flight to be {n} (it is {in_flight(client, policy)})")


def wait_counter(client, policy: str, name: str, n: int, timeout: float = 5.0) -> None:
    wait_until(lambda: counters(client, policy)[name] == n, timeout,
               what=f"{policy}'s {name} to be {n} (it is {counters(client, policy)})")


class ThreadedServer:
    """A server object with serve/stop run in a daemon thread."""

    def __init__(self, port: int, stop, thread: threading.Thread):
        self.port = port
        self._stop = stop
        self._thread = thread

    def stop(self) -> None:
        self._stop()
        self._thread.join(10)


def serve_wsgi(app) -> ThreadedServer:
    """werkzeug's threaded WSGI server (HTTP/1.1, keep-alive) on a free loopback port."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class KeepAlive(WSGIRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_request(self, *args, **kwargs):  # quiet
            pass

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=KeepAlive)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    return ThreadedServer(server.server_port, server.shutdown, t)


def serve_asgi(app) -> ThreadedServer:
    """uvicorn (h11) on a free loopback port, in a thread with its own event loop."""
    import uvicorn

    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", http="h11")
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert t.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)

    def stop():
        server.should_exit = True

    return ThreadedServer(port, stop, t)
