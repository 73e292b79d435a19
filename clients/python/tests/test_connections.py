"""A server survives its clients: idle, slow, crowding or hostile connections on either port.

Each test runs a real `sluice serve`; the low file-descriptor limit of the first ones is the
server process's own (RLIMIT_NOFILE set before exec).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import threading
import time

import grpc
import pytest

from conftest import free_port, metric, sluice_bin, wait_until

CONFIG = """
server:
  idle_timeout: {idle}
  request_timeout: 1s
  shutdown_grace: 20s
policies:
  api-rate:
    kind: rate
    strategy: gcra
    limit: 100000
    period: 1s
  pool:
    kind: adaptive
    algorithm: fixed
    limit: 5
"""

FD_LIMIT = 256


@pytest.fixture(autouse=True)
def enough_descriptors_for_the_test_itself():
    """This process opens hundreds of sockets: its own soft limit goes up to its hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096) if hard != resource.RLIM_INFINITY else 4096
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_idle(port: int, n: int):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(s)
    return socks


def server_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serves(server, client, key) -> bool:
    try:
        return client.check("api-rate", key).allowed and \
            server.http("GET", "/healthz", timeout=2).status == 200
    except Exception:  # noqa: BLE001 - any failure means "not serving yet"
        return False


def test_idle_crowds_on_both_ports_under_a_low_fd_limit_do_not_stop_it(start_server, key):
    """400 idle sockets on each port of a server limited to 256 descriptors: it sheds what
    exceeds its cap instead of running out, never spins, keeps answering the clients it has,
    and serves everyone again once the crowd is gone."""
    server = start_server(CONFIG.format(idle="60s"), fd_limit=FD_LIMIT)
    client = server.client()
    assert client.check("api-rate", key()).allowed  # this client's connection is up first
    cpu_before = server_cpu_seconds(server.proc.pid)
    crowd = open_idle(server.http_port, 400) + open_idle(server.grpc_port, 400)
    time.sleep(1.0)
    # Under the crowd: the connection it had still serves, and it is alive and says so.
    assert client.check("api-rate", key()).allowed
    assert server.running()
    for s in crowd:
        s.close()
    # Once they are gone, new connections on both ports are served again (a new gRPC channel,
    # a new HTTP connection).
    fresh = server.client()
    wait_until(lambda: serves(server, fresh, key()), timeout=10,
               what="both ports to serve new connections")
    samples = server.metrics()
    shed_http = metric(samples, "sluice_connections_shed_total", listener="http", reason="full")
    shed_grpc = metric(samples, "sluice_connections_shed_total", listener="grpc", reason="full")
    assert shed_http > 0 and shed_grpc > 0, (shed_http, shed_grpc)
    cap = metric(samples, "sluice_connections_max", listener="grpc")
    assert cap < FD_LIMIT / 2, cap  # the cap fits the descriptor limit
    assert "per port" in server.log()  # and the server said it lowered it
    # An accept loop spinning on EMFILE burns a core; this one used a fraction of a second.
    assert server_cpu_seconds(server.proc.pid) - cpu_before < 2.0


def test_idle_connections_are_closed_after_the_idle_timeout(start_server, key):
    server = start_server(CONFIG.format(idle="1s"), fd_limit=FD_LIMIT)
    http_idle = open_idle(server.http_port, 50)
    grpc_idle = open_idle(server.grpc_port, 50)
    time.sleep(0.2)
    samples = server.metrics()
    assert metric(samples, "sluice_connections", listener="http") >= 50
    assert metric(samples, "sluice_connections", listener="grpc") >= 50

    def closed(s):
        s.settimeout(6)
        try:
            return s.recv(4096) == b"" or closed(s)  # gRPC says goodbye (GOAWAY) first
        except (ConnectionResetError, socket.timeout):
            return False

    for s in http_idle:
        assert s.recv(1) == b"", "an idle HTTP connection was not closed"
    assert sum(1 for s in grpc_idle if closed(s)) == len(grpc_idle)
    for s in http_idle + grpc_idle:
        s.close()
    # The gRPC listener learns that gRPC closed them (within its one-second sweep).
    wait_until(lambda: metric(server.metrics(), "sluice_connections", listener="grpc") <= 1,
               timeout=5, what="the gRPC connection count to come down")
    assert server.client().check("api-rate", key()).allowed


def test_a_request_trickled_slower_than_the_request_timeout_is_cut_off(start_server):
    server = start_server(CONFIG.format(idle="60s"))
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=5)
    start = time.monotonic()
    s.sendall(b"GET /healthz HTTP/1.1\r\n")
    cut = False
    for _ in range(20):  # one header byte at a time, 4 s in all against a 1 s request_timeout
        try:
            s.sendall(b"X")
        except (BrokenPipeError, ConnectionResetError):
            cut = True
            break
        time.sleep(0.2)
    if not cut:
        s.settimeout(0.5)
        try:
            cut = s.recv(4096) == b""
        except ConnectionResetError:
            cut = True
    assert cut, "a slowloris request kept its connection"
    assert time.monotonic() - start < 2.5
    s.close()


def test_oversize_requests_get_413_and_431(server):
    r = server.http("POST", "/v1/check", body=b"{" + b" " * (1 << 20) + b"}",
                    headers={"Content-Type": "application/json"})
    assert r.status == 413 and r.json()["error"]["message"] == "body: larger than 1 MiB", r
    r = server.http("GET", "/healthz", headers={"X-Big": "x" * 9000})
    assert r.status == 431, r
    assert r.json()["error"]["message"] == "headers: larger than 8 KiB in all"


def test_past_the_cap_a_new_http_connection_is_told_503(start_server):
    server = start_server(CONFIG.format(idle="60s").replace(
        "request_timeout: 1s", "request_timeout: 1s\n  max_connections: 3"))
    # The start-up probe's connection must be gone before the three below take every slot.
    wait_until(lambda: metric(server.metrics(), "sluice_connections", listener="http") == 1,
               timeout=5, what="only the metrics request's own connection open")
    time.sleep(0.1)
    idle = open_idle(server.http_port, 3)
    time.sleep(0.2)
    r = server.http("GET", "/healthz")
    assert r.status == 503 and "connection cap" in r.text, r
    assert r.headers.get("retry-after") == "1"
    for s in idle:
        s.close()
    wait_until(lambda: server.http("GET", "/healthz").status == 200, timeout=5,
               what="a free connection slot")


def test_a_second_server_on_a_busy_grpc_port_fails_at_start(server):
    http_port = free_port()
    proc = subprocess.run([sluice_bin(), "serve", "--grpc", server.grpc_target,
                           "--http", f"127.0.0.1:{http_port}"],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 1, proc.stderr
    assert f"grpc: cannot listen on {server.grpc_target}: the address is already in use" \
        in proc.stderr, proc.stderr


def test_a_second_sigterm_during_the_drain_stops_at_once(start_server):
    server = start_server(CONFIG.format(idle="60s"))
    server.client().admit("pool")  # held: the drain would wait its 20 s grace
    server.signal(signal.SIGTERM)
    wait_until(lambda: "shutting down" in server.log(), timeout=5, what="the drain to start")
    time.sleep(0.3)
    assert server.running()
    start = time.monotonic()
    server.signal(signal.SIGTERM)
    assert server.proc.wait(timeout=5) == 0
    assert time.monotonic() - start < 2
    assert "second signal: stopping now, 1 lease(s) still held" in server.log()


def test_a_path_that_is_not_utf8_is_answered_404(server):
    """The 404 names the path; bytes that are not UTF-8 in it must not cost the answer."""
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=5)
    s.sendall(b"GET /n\x9a\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    s.close()
    assert data.startswith(b"HTTP/1.1 404"), data
    body = json.loads(data.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["message"] == "path: no endpoint /n\ufffd\ufffd"


def exchange(port: int, raw: bytes) -> bytes:
    """Sends `raw` on one connection and reads until the server closes it."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(raw)
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except socket.timeout:
        pass
    s.close()
    return data


@pytest.mark.parametrize("coding,status,says", [
    (b"xchunked", b"400", b"does not end in chunked"),
    (b"chunked, identity", b"400", b"does not end in chunked"),
    (b"identity", b"400", b"does not end in chunked"),
    (b"gzip, chunked", b"501", b"only chunked is implemented"),
    (b"chunked\r\nTransfer-Encoding: chunked", b"400", b"Transfer-Encoding"),
    (b"chunked\r\nContent-Length: 5", b"400", b"Content-Length"),
])
def test_a_body_whose_length_cannot_be_known_is_refused_and_never_runs_as_a_request(
        server, coding, status, says):
    """RFC 9112 6.1: a transfer coding that is not exactly chunked is answered (501 for one not
    implemented, else 400) and the connection closed: the body, a whole admit, never runs."""
    smuggled = (b'POST /v1/admit HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                b'Content-Length: 18\r\n\r\n{"policy":"small"}')
    raw = (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: " + coding + b"\r\n\r\n" + smuggled)
    data = exchange(server.http_port, raw)
    assert data.startswith(b"HTTP/1.1 " + status), data
    assert data.count(b"Server: sluice") == 1, data  # one answer: the admit never ran
    assert says in data.split(b"\r\n\r\n", 1)[1], data
    assert server.client().policies().leases == 0
    # A chunked body is read as one.
    body = b'{"policy":"api-rate","key":"te"}'
    data = exchange(server.http_port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    b"Content-Type: application/json\r\nTransfer-Encoding: Chunked\r\n\r\n" +
                    b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200"), data


def test_headers_over_8_kib_in_all_are_431_however_they_are_split(server):
    fields = b"".join(b"X-Field-%d: %s\r\n" % (i, b"v" * 100) for i in range(100))  # ~11.5 KiB
    data = exchange(server.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    assert data.startswith(b"HTTP/1.1 431"), data
    assert b"headers: larger than 8 KiB in all" in data, data
    fields = b"".join(b"X-Field-%d: %s\r\n" % (i, b"v" * 100) for i in range(60))  # ~6.9 KiB
    data = exchange(server.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    + fields + b"\r\n")
    assert data.startswith(b"HTTP/1.1 200"), data


def test_grpc_calls_open_at_once_on_one_connection_are_capped(start_server):
    """server.max_streams_per_connection: past it, a client's further call waits for one to end
    (a hostile client that does not wait is refused its streams), so held calls such as health
    Watch cannot pile up on one connection."""
    server = start_server("server:\n  max_streams_per_connection: 4\n"
                          "policies:\n  r: {kind: rate, limit: 5, period: 1s}\n")
    channel = grpc.insecure_channel(server.grpc_target)
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
    calls = [watch(b"") for _ in range(4)]
    try:
        for c in calls:
            assert next(c) == b"\x08\x01"  # SERVING
        extra = watch(b"")
        got = []
        reader = threading.Thread(target=lambda: got.append(next(extra)), daemon=True)
        reader.start()
        reader.join(0.7)
        assert not got, "a fifth stream was opened on the connection"
        calls[0].cancel()
        reader.join(5)
        assert got == [b"\x08\x01"]
        extra.cancel()
    finally:
        for c in calls:
            c.cancel()
        channel.close()


def vm_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_health_watch_streams_are_capped_server_wide_and_cancelled_ones_give_memory_back(
        start_server):
    """server.max_watch_streams: past it, a Watch on any connection is finished at once with
    RESOURCE_EXHAUSTED naming the setting; cancelled Watches give their slots back (a new one is
    served) and the server's memory comes back to about where it was."""
    cap, per_channel, channels = 1500, 500, 4  # 2,000 Watches asked for, 1,500 served
    server = start_server(f"server:\n  max_watch_streams: {cap}\n"
                          "policies:\n  r: {kind: rate, limit: 5, period: 1s}\n")
    pid = server.proc.pid
    opened = [grpc.insecure_channel(server.grpc_target,
                                    options=[("grpc.use_local_subchannel_pool", 1)])
              for _ in range(channels)]
    watches = [c.unary_stream("/grpc.health.v1.Health/Watch") for c in opened]
    # Warm up (gRPC's threads and caches, one connection each), then the level before.
    for w in watches:
        first = w(b"", timeout=60)
        assert next(first) == b"\x08\x01"
        first.cancel()
    time.sleep(0.5)
    before = vm_rss_mib(pid)

    calls = [w(b"", timeout=60) for w in watches for _ in range(per_channel)]
    served, refused = [], []
    for c in calls:
        try:
            assert next(c) == b"\x08\x01"  # SERVING
            served.append(c)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            assert f"{cap} Watch streams are open (server.max_watch_streams)" in e.details(), e
            refused.append(c)
    peak = vm_rss_mib(pid)
    try:
        assert (len(served), len(refused)) == (cap, per_channel * channels - cap)
    finally:
        for c in calls:
            c.cancel()

    # The slots come back: a Watch is served again.
    def served_again():
        c = watches[-1](b"", timeout=60)
        try:
            return next(c) == b"\x08\x01"
        except grpc.RpcError:
            return False
        finally:
            c.cancel()
    wait_until(served_again, timeout=10, what="a Watch served after the others were cancelled")
    # And the memory, within 10 s: the connections stay open, the streams are gone.
    deadline = time.monotonic() + 10
    while (after := vm_rss_mib(pid)) > before + 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    for c in opened:
        c.close()
    assert after <= before + 20, \
        f"VmRSS {before:.1f} MiB before, {peak:.1f} with {cap} Watches open, {after:.1f} after"


def h2_frame(kind: int, flags: int = 0, payload: bytes = b"", stream: int = 0) -> bytes:
    """An HTTP/2 frame (RFC 9113, 4.1)."""
    return (len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
            + payload)


def h2_read_frame(s: socket.socket):
    """(type, flags, payload) of the next frame; None at the end of the connection."""
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data
    head = exactly(9)
    if head is None:
        return None
    payload = exactly(int.from_bytes(head[:3], "big"))
    return (head[3], head[4], payload) if payload is not None else None


def h2_open(port: int) -> socket.socket:
    """An HTTP/2 connection with no call on it: the preface and an empty SETTINGS."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4))
    return s


SETTINGS, PING, GOAWAY = 4, 6, 7


def test_grpc_pings_a_quiet_connection_and_closes_it_when_the_ping_goes_unanswered(
        start_server):
    """server.keepalive: gRPC pings a connection quiet for that long (a call under way or not)
    and closes it when the ping is not answered within the keepalive (at most 10 s); a client
    that answers keeps its connection."""
    server = start_server("server:\n  keepalive: 300ms\n"
                          "policies:\n  r: {kind: rate, limit: 5, period: 1s}\n")
    # Not answered: pinged, then closed (the connection ends).
    s = h2_open(server.grpc_port)
    seen, opened = [], time.monotonic()
    pinged_after = None
    while True:
        frame = h2_read_frame(s)
        if frame is None:
            break
        kind, flags, _ = frame
        seen.append(kind)
        if kind == SETTINGS and not flags & 1:
            s.sendall(h2_frame(SETTINGS, 1))  # acknowledged: the connection is up
        if kind == PING and not flags & 1 and pinged_after is None:
            pinged_after = time.monotonic() - opened
    closed_after = time.monotonic() - opened
    s.close()
    assert pinged_after is not None, f"no PING in {closed_after:.1f} s: frames {seen}"
    assert pinged_after < closed_after < 5, (pinged_after, closed_after, seen)

    # Answered: every PING acknowledged, the connection outlives many keepalives.
    s = h2_open(server.grpc_port)
    s.settimeout(0.2)
    pings = 0
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        try:
            frame = h2_read_frame(s)
        except socket.timeout:
            continue
        assert frame is not None, f"closed though its {pings} PINGs were answered"
        kind, flags, payload = frame
        assert kind != GOAWAY, f"GOAWAY though its {pings} PINGs were answered"
        if kind == SETTINGS and not flags & 1:
            s.sendall(h2_frame(SETTINGS, 1))
        if kind == PING and not flags & 1:
            pings += 1
            s.sendall(h2_frame(PING, 1, payload))
    s.close()
    assert pings >= 1
