"""The gateway's `queue` strategy as a real server serves it, over gRPC and HTTP: a call that
finds its upstream full waits in the upstream's queue (holding no server thread) and is handed
a slot when one is released, in arrival order; a full queue refuses at once; a wait ends at the
queue's timeout or the call's own bound (max_wait, its deadline) with a refusal that says how
long it waited; a caller that goes away leaves the queue at once; a reload that removes the
policy and a SIGTERM answer every queued call. In-flight returns to 0 after each test: no slot
is leaked by any of these ends."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import subprocess
import threading
import time

import grpc
import pytest

from conftest import metric, sluice_bin, wait_until
from sluice_client import Refused, Unavailable
from sluice.v1 import sluice_pb2, sluice_pb2_grpc

TIMEOUT = 1.0  # the queue's timeout, seconds

CONFIG = f"""
server:
  lease_ttl: 30s
policies:
  gw:
    kind: concurrency
    tenants:
      - id: t
    upstreams:
      - id: q
        host: q.internal
        owner: t
        concurrency_limit:
          max_concurrent: 1
          strategy: queue
          queue:
            max_depth: 3
            timeout: {int(TIMEOUT * 1000)}ms
      - id: plain
        host: plain.internal
        owner: t
        concurrency_limit:
          max_concurrent: 1
"""


def gw_state(server) -> dict:
    for p in server.http("GET", "/v1/policies").json()["policies"]:
        if p["name"] == "gw":
            return p
    raise AssertionError("no policy gw")


def waiting(server) -> int:
    return gw_state(server).get("queues", {}).get("q", {}).get("waiting", 0)


def in_flight(server) -> int:
    return gw_state(server)["in_flight"]


def admit_http(server, timeout: float = 10.0, **fields):
    body = {"policy": "gw", "tenant": "t", "upstream": "q", **fields}
    return server.http("POST", "/v1/admit", body, timeout=timeout)


@pytest.fixture
def gw(start_server):
    s = start_server(CONFIG)
    yield s
    # Whatever a test did, no slot stays taken and nobody waits.
    wait_until(lambda: in_flight(s) == 0 and waiting(s) == 0, 5, what="no lease and no waiter")


def test_queued_calls_are_handed_slots_in_arrival_order_over_grpc(gw):
    c = gw.client()
    first = c.admit("gw", tenant="t", upstream="q")
    order, leases, errors = [], {}, []

    def queued(i: int):
        try:
            lease = c.admit("gw", tenant="t", upstream="q", max_wait=10)
            order.append(i)
            leases[i] = lease
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = []
    for i in range(3):
        t = threading.Thread(target=queued, args=(i,))
        t.start()
        threads.append(t)
        wait_until(lambda: waiting(gw) == i + 1, 5, what=f"{i + 1} waiting")
    assert order == []  # all three wait: the slot is taken
    # Arrivals do not barge: a call with max_wait 0 is refused while others wait.
    with pytest.raises(Refused):
        c.admit("gw", tenant="t", upstream="q", max_wait=0)
    c.release(first)
    for i in range(3):
        wait_until(lambda: len(order) == i + 1, 5, what=f"waiter {i} admitted")
        assert order == list(range(i + 1))
        assert leases[i].waited > 0
        time.sleep(0.05)
        assert len(order) == i + 1  # one slot, one waiter
        c.release(leases[i])
    for t in threads:
        t.join()
    assert not errors, errors
    q = gw_state(gw)["queues"]["q"]
    assert q["handoff"] == 3 and q["waiting"] == 0


def test_a_full_queue_refuses_at_once_saying_so_over_http(gw):
    c = gw.client()
    first = c.admit("gw", tenant="t", upstream="q")
    pool = concurrent.futures.ThreadPoolExecutor(3)
    futures = [pool.submit(admit_http, gw) for _ in range(3)]
    wait_until(lambda: waiting(gw) == 3, 5, what="3 waiting")
    t0 = time.monotonic()
    r = admit_http(gw)
    assert time.monotonic() - t0 < 0.5  # at once, not after a wait
    assert r.status == 503, r
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"] == "1"
    p = r.json()
    assert p["reason"] == "queue_full" and p["upstream_id"] == "q", p
    assert "waited_seconds" not in p
    c.release(first)
    # The three waiters are served one by one as each is released.
    for _ in range(3):
        r = None
        done = wait_until(lambda: [f for f in futures if f.done()], 5, what="a waiter served")
        r = done[0].result()
        futures.remove(done[0])
        assert r.status == 200 and r.json()["waited_ms"] > 0, r
        gw.http("POST", "/v1/release", {"lease_id": r.json()["lease_id"]})
    pool.shutdown()
    samples = gw.metrics()
    assert metric(samples, "sluice_gateway_queue_calls_total", policy="gw", upstream="q",
                  outcome="full") == 1
    assert metric(samples, "sluice_gateway_queue_calls_total", policy="gw", upstream="q",
                  outcome="handoff") == 3
    assert metric(samples, "sluice_gateway_queue_waiting", policy="gw", upstream="q") == 0
    assert metric(samples, "sluice_gateway_queue_wait_seconds_count", policy="gw",
                  upstream="q") == 3


def test_a_wait_ends_at_the_queues_timeout_saying_how_long_over_both(gw):
    c = gw.client()
    first = c.admit("gw", tenant="t", upstream="q")
    t0 = time.monotonic()
    r = admit_http(gw)
    took = time.monotonic() - t0
    assert r.status == 503, r
    assert r.headers["retry-after"] == "1"
    p = r.json()
    assert p["reason"] == "queue_timeout", p
    assert TIMEOUT - 0.01 <= p["waited_seconds"] <= took, (p, took)
    assert p["detail"].startswith("Waited 1.0") and "the queue's timeout: 1.000 s" in p["detail"]
    with pytest.raises(Refused) as refused:
        c.admit("gw", tenant="t", upstream="q")
    assert refused.value.problem["reason"] == "queue_timeout"
    assert refused.value.waited >= TIMEOUT - 0.01
    c.release(first)
    samples = gw.metrics()
    assert metric(samples, "sluice_gateway_queue_calls_total", policy="gw", upstream="q",
                  outcome="timeout") == 2


def test_a_wait_never_outlasts_the_calls_own_bound(gw):
    c = gw.client()
    first = c.admit("gw", tenant="t", upstream="q")
    # HTTP: max_wait_ms.
    t0 = time.monotonic()
    r = admit_http(gw, max_wait_ms=150)
    assert r.status == 503 and time.monotonic() - t0 < TIMEOUT * 0.8, r
    p = r.json()
    assert p["reason"] == "queue_timeout" and 0.14 <= p["waited_seconds"] < 0.5, p
    assert "the call's max_wait" in p["detail"], p
    # gRPC: the call's deadline (0.3 s) is the bound: a refusal before it, not DEADLINE_EXCEEDED.
    # (Refused, not DeadlineExceeded: the answer came before the deadline. How long it waited
    # depends on when the call reached the server and when its timer fired: on a loaded
    # machine either may be late by tens of milliseconds.)
    short = gw.client(timeout=0.3)
    with pytest.raises(Refused) as refused:
        short.admit("gw", tenant="t", upstream="q")
    assert 0.1 <= refused.value.waited < 0.3 and "the call's max_wait" in refused.value.detail
    # A call that may not wait at all is refused at once as before.
    with pytest.raises(Refused) as refused:
        c.admit("gw", tenant="t", upstream="q", max_wait=0)
    assert refused.value.problem["reason"] == "limit_reached" and refused.value.waited == 0
    # An upstream without a queue never waits.
    plain = c.admit("gw", tenant="t", upstream="plain")
    t0 = time.monotonic()
    with pytest.raises(Refused):
        c.admit("gw", tenant="t", upstream="plain")
    assert time.monotonic() - t0 < TIMEOUT / 2  # at once: far from any queue's timeout
    c.release(plain)
    c.release(first)
    samples = gw.metrics()
    assert metric(samples, "sluice_gateway_queue_calls_total", policy="gw", upstream="q",
                  outcome="deadline") == 2


def test_a_caller_that_goes_away_leaves_the_queue_and_takes_no_slot(gw):
    c = gw.client()
    first = c.admit("gw", tenant="t", upstream="q")
    # gRPC: a cancelled call.
    channel = grpc.insecure_channel(gw.grpc_target)
    stub = sluice_pb2_grpc.SluiceStub(channel)
    future = stub.Admit.future(sluice_pb2.AdmitRequest(policy="gw", tenant="t", upstream="q"),
                               timeout=10)
    wait_until(lambda: waiting(gw) == 1, 5, what="the gRPC call waiting")
    future.cancel()
    wait_until(lambda: waiting(gw) == 0, 2, what="the cancelled call gone from the queue")
    channel.close()
    # HTTP: a client that closes its connection while queued.
    sock = socket.create_connection(("127.0.0.1", gw.http_port))
    body = json.dumps({"policy": "gw", "tenant": "t", "upstream": "q"}).encode()
    sock.sendall(b"POST /v1/admit HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    wait_until(lambda: waiting(gw) == 1, 5, what="the HTTP call waiting")
    sock.close()
    wait_until(lambda: waiting(gw) == 0, 2, what="the closed call gone from the queue")
    # The slot released now goes to nobody who left: it is free.
    c.release(first)
    assert in_flight(gw) == 0
    again = c.admit("gw", tenant="t", upstream="q", max_wait=0)
    c.release(again)
    q = gw_state(gw)["queues"]["q"]
    assert q["cancelled"] == 2 and q["handoff"] == 0, q


def test_a_reload_that_raises_the_limit_admits_the_waiters(gw):
    c = gw.client()
    first = c.admit("gw", tenant="t", upstream="q")
    pool = concurrent.futures.ThreadPoolExecutor(2)
    futures = [pool.submit(c.admit, "gw", tenant="t", upstream="q", max_wait=10)
               for _ in range(2)]
    wait_until(lambda: waiting(gw) == 2, 5, what="2 waiting")
    gw.write_config(CONFIG.replace("max_concurrent: 1\n          strategy",
                                   "max_concurrent: 3\n          strategy"))
    r = gw.http("POST", "/admin/reload")
    assert r.status == 200, r
    leases = [f.result(timeout=5) for f in futures]
    assert all(lease.waited > 0 for lease in leases)
    for lease in leases + [first]:
        c.release(lease)
    pool.shutdown()


def test_a_reload_that_removes_the_policy_answers_every_queued_call(gw):
    c = gw.client()
    first = c.admit("gw", tenant="t", upstream="q")
    pool = concurrent.futures.ThreadPoolExecutor(2)
    g = pool.submit(c.admit, "gw", tenant="t", upstream="q", max_wait=30)
    h = pool.submit(admit_http, gw, 30)
    wait_until(lambda: waiting(gw) == 2, 5, what="2 waiting")
    gone = CONFIG.replace("policies:\n  gw:", "policies:\n  gw2:")
    gw.write_config(gone)
    t0 = time.monotonic()
    assert gw.http("POST", "/admin/reload").status == 200
    with pytest.raises(Unavailable) as e:
        g.result(timeout=5)
    assert "removed or replaced by a reload" in str(e.value)
    r = h.result(timeout=5)
    assert r.status == 503, r
    assert "removed or replaced by a reload" in r.json()["error"]["message"], r
    assert time.monotonic() - t0 < 2
    c.release(first)  # a lease outlives its policy's removal
    pool.shutdown()
    gw.write_config(CONFIG)  # for the fixture's final check
    assert gw.http("POST", "/admin/reload").status == 200


def test_sigterm_answers_every_queued_call(start_server):
    s = start_server(CONFIG)
    c = s.client()
    first = c.admit("gw", tenant="t", upstream="q")
    pool = concurrent.futures.ThreadPoolExecutor(2)
    g = pool.submit(c.admit, "gw", tenant="t", upstream="q", max_wait=30)
    h = pool.submit(admit_http, s, 30)
    wait_until(lambda: waiting(s) == 2, 5, what="2 waiting")
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    with pytest.raises(Unavailable) as e:
        g.result(timeout=10)
    assert "server: stopping" in str(e.value)
    r = h.result(timeout=10)
    assert r.status == 503 and "server: stopping" in r.json()["error"]["message"], r
    assert time.monotonic() - t0 < 2  # at once, not at the queue's timeout or the grace's end
    c.release(first)  # the server waits for held leases (its grace period), not for waiters
    assert s.proc.wait(10) == 0
    pool.shutdown()


def test_the_cli_shows_the_wait(gw):
    c = gw.client()
    first = c.admit("gw", tenant="t", upstream="q")
    cli = [sluice_bin(), "admit", "gw", "-t", "t", "-u", "q", "--server", gw.grpc_target]
    out = subprocess.run(cli + ["--max-wait", "200ms"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 1, out
    assert "waited" in out.stdout and "the call's max_wait" in out.stdout, out.stdout
    # Admitted after waiting: the slot is released 0.2 s after the CLI's call is seen queued, so
    # it waited at least that long (however long the CLI took to start).
    proc = subprocess.Popen(cli + ["--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_until(lambda: waiting(gw) == 1, 5, what="the CLI's call queued")
    time.sleep(0.2)
    c.release(first)
    stdout, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, (stdout, stderr)
    j = json.loads(stdout)
    assert j["admitted"] and 0.2 <= j["waited_seconds"] < TIMEOUT, j
    c.release(j["lease_id"])
