"""The WSGI middleware (sluice_client.wsgi) on a Flask app served by werkzeug's threaded server
over real HTTP, against a real `sluice serve`: rate and concurrency policies, 429/503 with
Retry-After and problem+json, leases released with the response's outcome, failing open and
closed, kept leases (lease_reuse)."""

from __future__ import annotations

import threading
import time

import pytest

flask = pytest.importorskip("flask", reason="needs python3-flask")

from adapter_support import (CONFIG, Http, closed_port_target, counters, get,  # noqa: E402
                             in_flight, problem_of, serve_wsgi, wait_counter, wait_in_flight)
from conftest import wait_until  # noqa: E402
from sluice_client.adapters import current_admission, header  # noqa: E402
from sluice_client.wsgi import SluiceWSGIMiddleware  # noqa: E402


class App:
    """A Flask app behind the middleware; counts the requests that reached it."""

    def __init__(self, policy: str, **options):
        self.calls = 0
        self.entered = threading.Event()
        self.proceed = threading.Event()
        self.admissions = []
        app = flask.Flask("sluice-wsgi-test")

        @app.get("/ok")
        def ok():
            self.calls += 1
            return "ok"

        @app.get("/other")
        def other():
            self.calls += 1
            return "other"

        @app.get("/slow")
        def slow():
            self.calls += 1
            self.entered.set()
            assert self.proceed.wait(10)
            return "slow"

        @app.get("/status/<int:code>")
        def status(code):
            self.calls += 1
            return "status", code

        @app.get("/boom")
        def boom():
            self.calls += 1
            raise RuntimeError("boom")

        @app.get("/sleep")
        def sleep():
            self.calls += 1
            self.admissions.append(current_admission())
            time.sleep(0.2)
            return "slept"

        @app.get("/choose")
        def choose():
            self.calls += 1
            current_admission().outcome = "dropped"
            return "chose"

        self.middleware = SluiceWSGIMiddleware(app.wsgi_app, policy, **options)
        app.wsgi_app = self.middleware  # the one line
        self.server = serve_wsgi(app)
        self.port = self.server.port

    def stop(self):
        self.server.stop()
        self.middleware.gate.close()


@pytest.fixture
def sluice(start_server):
    return start_server(CONFIG)


@pytest.fixture
def apps():
    started = []

    def make(policy, **options):
        a = App(policy, **options)
        started.append(a)
        return a

    yield make
    for a in started:
        a.stop()


def test_rate_policy_keyed_by_header_refuses_with_429(sluice, apps):
    app = apps("rate2", target=sluice.grpc_target, key=header("X-Api-Key"))
    c = Http(app.port)
    for _ in range(2):
        status, _, body = c.get("/ok", {"X-Api-Key": "alice"})
        assert (status, body) == (200, b"ok")
    status, headers, body = c.get("/ok", {"X-Api-Key": "alice"})
    assert status == 429, body
    assert 1 <= int(headers["retry-after"]) <= 3600, headers
    problem = problem_of(headers, body)
    assert problem["type"] == "urn:sluice:problem:rate-limit-exceeded"
    assert problem["status"] == 429 and problem["policy"] == "rate2"
    assert problem["retry_after_seconds"] == int(headers["retry-after"])
    assert app.calls == 2, "a refused request must not reach the application"
    # Another key has its own allowance; the connection is still usable after a refusal.
    status, _, body = c.get("/ok", {"X-Api-Key": "bob"})
    assert (status, body) == (200, b"ok")
    assert app.calls == 3
    c.close()


def test_rate_policy_keyed_by_route_by_default(sluice, apps):
    app = apps("rate2", target=sluice.grpc_target)
    assert [get(app.port, "/ok")[0] for _ in range(3)] == [200, 200, 429]
    assert get(app.port, "/other")[0] == 200  # "GET /other": another key
    assert app.calls == 3


@pytest.mark.parametrize("background", [False, True], ids=["release", "background_release"])
def test_concurrency_policy_refuses_with_503_and_releases(sluice, apps, background):
    client = sluice.client()
    app = apps("one", target=sluice.grpc_target, background_release=background)
    before = counters(client, "one")
    results = []
    t = threading.Thread(target=lambda: results.append(get(app.port, "/slow")))
    t.start()
    assert app.entered.wait(5)
    wait_in_flight(client, "one", 1)
    status, headers, body = get(app.port, "/ok")
    assert status == 503, body
    assert headers["retry-after"] == "1"
    problem = problem_of(headers, body)
    assert problem["type"] == "urn:sluice:problem:concurrency-limit-exceeded"
    assert problem["status"] == 503 and problem["policy"] == "one"
    assert app.calls == 1
    app.proceed.set()
    t.join(10)
    assert results and results[0][0] == 200 and results[0][2] == b"slow"
    wait_in_flight(client, "one", 0)
    assert get(app.port, "/ok")[0] == 200
    wait_in_flight(client, "one", 0)
    after = counters(client, "one")
    assert after["accepted"] - before["accepted"] == 2
    assert after["rejected"] - before["rejected"] == 1
    assert after["dropped"] == before["dropped"] and after["ignored"] == before["ignored"]


def test_lease_reuse_carries_the_next_requests_of_a_key_without_an_admit(sluice, apps):
    """With lease_reuse, a finished request's lease carries the next request of its key: one
    Admit for six requests. The waiting lease holds its permit (another key is refused at the
    limit of one), and close() releases it with every request it carried, each recorded."""
    client = sluice.client()
    app = apps("one", target=sluice.grpc_target, key=header("X-Key"), lease_reuse=30)
    before = counters(client, "one")
    c = Http(app.port)
    for _ in range(5):
        assert c.get("/ok", {"X-Key": "k"})[0] == 200
    assert c.get("/choose", {"X-Key": "k"})[0] == 200  # the app sets "dropped"
    gate = app.middleware.gate
    # The last request's lease goes back to the pool when waitress closes its response, which
    # may come just after the client has read it.
    wait_until(lambda: gate.leases_waiting() == 1, 5, what="the last request's lease back")
    assert gate.stats["reused"] == 5 and gate.stats["keeps"] == 0
    assert in_flight(client, "one") == 1
    assert c.get("/ok", {"X-Key": "other"})[0] == 503  # the one permit waits for key k
    assert counters(client, "one")["accepted"] - before["accepted"] == 1  # nothing reported yet
    c.close()
    gate.close()
    wait_in_flight(client, "one", 0)
    after = counters(client, "one")
    assert after["accepted"] - before["accepted"] == 6
    assert after["dropped"] - before["dropped"] == 1
    assert client.policies()["one"].state["renewed"] == 5


def test_lease_reuse_is_checked():
    from sluice_client.adapters import Gate
    with pytest.raises(ValueError, match="^lease_reuse: must be >= 0"):
        Gate("one", lease_reuse=-1)
    with pytest.raises(ValueError, match="^lease_reuse: only a concurrency policy"):
        Gate("rate2", kind="rate", lease_reuse=1)


def test_a_kept_lease_the_server_lost_is_not_used_again(sluice, apps):
    """The gate's thread reports a kept lease's requests with keep while it carries one; a keep
    the server refuses (the lease expired there) retires the lease: released after its request,
    and the next request is admitted afresh."""
    client = sluice.client()
    app = apps("one", target=sluice.grpc_target, lease_reuse=0.3, ttl=0.2, key=lambda r: "k")
    gate = app.middleware.gate
    assert get(app.port, "/ok")[0] == 200
    results = []
    t = threading.Thread(target=lambda: results.append(get(app.port, "/slow")))
    t.start()  # on the kept lease, busy until told
    assert app.entered.wait(5)
    wait_until(lambda: gate.stats["keeps"] == 1 and gate.stats["release_errors"] == 1, 5,
               what="the keep, refused: the lease expired at the server")
    app.proceed.set()
    t.join(10)
    assert results and results[0][0] == 200
    wait_until(lambda: gate.stats["release_errors"] == 2, 5, what="the retired lease's release")
    assert gate.leases_waiting() == 0
    assert get(app.port, "/ok")[0] == 200  # admitted afresh
    assert gate.stats["reused"] == 1
    assert in_flight(client, "one") == 1
    gate.close()
    wait_in_flight(client, "one", 0)


def test_outcomes_reported_from_the_response(sluice, apps):
    client = sluice.client()
    app = apps("one", target=sluice.grpc_target)
    base = counters(client, "one")
    c = Http(app.port)
    assert c.get("/status/503")[0] == 503  # the app shed it: overload, a drop
    wait_counter(client, "one", "dropped", base["dropped"] + 1)
    assert c.get("/status/504")[0] == 504  # its upstream timed out: a drop
    wait_counter(client, "one", "dropped", base["dropped"] + 2)
    assert c.get("/boom")[0] == 500  # failed: no latency evidence (ignored by the limit)
    wait_counter(client, "one", "ignored", base["ignored"] + 1)
    assert c.get("/status/404")[0] == 404  # the caller's error: a success
    assert c.get("/choose")[0] == 200  # the app chose "dropped"
    wait_counter(client, "one", "dropped", base["dropped"] + 3)
    assert c.get("/sleep")[0] == 200
    wait_in_flight(client, "one", 0)
    now = counters(client, "one")
    assert now["accepted"] - base["accepted"] == 6
    assert now["ignored"] == base["ignored"] + 1 and now["dropped"] == base["dropped"] + 3
    (adm,) = app.admissions
    assert adm.released_outcome == "success"
    assert 0.2 <= adm.rtt < 2.0, adm.rtt  # the latency reported: the handler's 0.2 s
    c.close()


def test_chained_rate_policy_refuses_with_429(sluice, apps):
    client = sluice.client()
    app = apps("chained", target=sluice.grpc_target, key=header("x-user"))
    assert get(app.port, "/ok", {"x-user": "carol"})[0] == 200
    status, headers, body = get(app.port, "/ok", {"x-user": "carol"})
    assert status == 429, body
    assert 1 <= int(headers["retry-after"]) <= 3600
    problem = problem_of(headers, body)
    assert problem["policy"] == "rate1" and problem["status"] == 429
    wait_in_flight(client, "chained", 0)


def test_unreachable_server_fails_open_by_default(apps):
    app = apps("one", target=closed_port_target())
    assert get(app.port, "/ok")[:3:2] == (200, b"ok")
    assert get(app.port, "/ok")[0] == 200  # within unreachable_retry: not even asked
    assert app.calls == 2
    assert app.middleware.gate.stats["unchecked"] == 2


def test_unreachable_server_fails_closed_when_asked(apps):
    app = apps("one", target=closed_port_target(), fail_open=False, unreachable_retry=2.5)
    status, headers, body = get(app.port, "/ok")
    assert status == 503
    assert headers["retry-after"] == "3"  # 2.5 s, rounded up
    assert problem_of(headers, body)["type"] == "urn:sluice:problem:admission-unavailable"
    assert app.calls == 0


GATEWAY = """\
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
          queue: {max_depth: 3, timeout: 5s}
"""


@pytest.mark.parametrize("max_wait", [0.0, 3.0])
def test_gateway_attributes_and_waiting_in_its_queue(start_server, apps, max_wait):
    sluice = start_server(GATEWAY)
    client = sluice.client()
    app = apps("gw", target=sluice.grpc_target, tenant=header("x-tenant"), upstream="q",
               max_wait=max_wait)
    results = []
    t = threading.Thread(target=lambda: results.append(get(app.port, "/slow", {"x-tenant": "t"})))
    t.start()
    assert app.entered.wait(5)
    wait_in_flight(client, "gw", 1)
    if max_wait == 0:  # the upstream is full and the request may not wait: refused at once
        status, headers, body = get(app.port, "/ok", {"x-tenant": "t"})
        assert status == 503 and headers["retry-after"], body
        assert problem_of(headers, body)["policy"] == "gw"
        app.proceed.set()
    else:  # it waits in the queue until the slow request's release hands it the slot
        threading.Timer(0.3, app.proceed.set).start()
        started = time.monotonic()
        status, _, body = get(app.port, "/ok", {"x-tenant": "t"})
        assert (status, body) == (200, b"ok")
        assert time.monotonic() - started >= 0.25
    t.join(10)
    assert results and results[0][0] == 200
    wait_in_flight(client, "gw", 0)


def test_values_the_server_rejects_are_a_400_whatever_the_failure_mode(start_server, apps):
    sluice = start_server(GATEWAY)
    app = apps("gw", target=sluice.grpc_target, tenant=header("x-tenant"), upstream="q")
    for headers, field in (({}, "tenant"), ({"x-tenant": "nobody"}, "tenant")):
        status, resp_headers, body = get(app.port, "/ok", headers)
        assert status == 400, body
        problem = problem_of(resp_headers, body)
        assert problem["type"] == "urn:sluice:problem:admission-bad-request"
        assert problem["field"] == field and "retry-after" not in resp_headers
    assert app.calls == 0, "fail open must not let a request without its tenant through"
    # An unknown policy is the deployment's error, not the request's: the failure mode applies.
    other = apps("no-such-policy", target=sluice.grpc_target)
    assert get(other.port, "/ok")[0] == 200
    assert other.middleware.gate.stats["unchecked"] == 1
