"""The ASGI middleware (sluice_client.asgi) on a Starlette app served by uvicorn over real HTTP,
against a real `sluice serve`: rate and concurrency policies, 429/503 with Retry-After and
problem+json, leases released with the response's outcome (and on a client's disconnect),
failing open and closed, kept leases (lease_reuse)."""

from __future__ import annotations

import asyncio
import threading

import pytest

starlette = pytest.importorskip("starlette", reason="needs python3-starlette")
pytest.importorskip("uvicorn", reason="needs python3-uvicorn")

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import PlainTextResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from adapter_support import (CONFIG, Http, closed_port_target, counters, get,  # noqa: E402
                             problem_of, serve_asgi, wait_counter, wait_in_flight)
from sluice_client.adapters import current_admission, header  # noqa: E402
from sluice_client.asgi import SluiceASGIMiddleware  # noqa: E402


class App:
    """A Starlette app behind the middleware; counts the requests that reached it."""

    def __init__(self, policy: str, **options):
        self.calls = 0
        self.entered = threading.Event()
        self.proceed = threading.Event()
        self.admissions = []

        async def ok(request):
            self.calls += 1
            return PlainTextResponse("ok")

        async def slow(request):
            self.calls += 1
            self.entered.set()
            while not self.proceed.is_set():
                await asyncio.sleep(0.01)
            return PlainTextResponse("slow")

        async def status(request):
            self.calls += 1
            return PlainTextResponse("status", status_code=int(request.path_params["code"]))

        async def boom(request):
            self.calls += 1
            raise RuntimeError("boom")

        async def sleep(request):
            self.calls += 1
            self.admissions.append((current_admission(), request.state.sluice))
            await asyncio.sleep(0.2)
            return PlainTextResponse("slept")

        async def choose(request):
            self.calls += 1
            current_admission().outcome = "dropped"
            return PlainTextResponse("chose")

        app = Starlette(routes=[
            Route("/ok", ok), Route("/other", ok), Route("/slow", slow),
            Route("/status/{code}", status), Route("/boom", boom), Route("/sleep", sleep),
            Route("/choose", choose)])
        app.add_middleware(SluiceASGIMiddleware, policy=policy, **options)  # the one line
        self.app = app
        self.server = serve_asgi(app)
        self.port = self.server.port

    @property
    def gate(self):
        # Starlette builds its middleware stack at the first request.
        layer = self.app.middleware_stack
        while not isinstance(layer, SluiceASGIMiddleware):
            layer = layer.app
        return layer.gate

    def stop(self):
        self.server.stop()


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
    status, _, body = c.get("/ok", {"X-Api-Key": "bob"})
    assert (status, body) == (200, b"ok")
    assert app.calls == 3
    c.close()


def test_rate_policy_keyed_by_route_by_default(sluice, apps):
    app = apps("rate2", target=sluice.grpc_target)
    assert [get(app.port, "/ok")[0] for _ in range(3)] == [200, 200, 429]
    assert get(app.port, "/other")[0] == 200
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


def test_lease_reuse_on_the_event_loop_and_its_sweeper(sluice, apps):
    """On the asyncio driver too: one Admit for the requests of a key; the lease that then waits
    lease_reuse without a request is released by the gate's thread, with what it carried."""
    client = sluice.client()
    app = apps("one", target=sluice.grpc_target, key=header("X-Key"), lease_reuse=0.5)
    before = counters(client, "one")
    c = Http(app.port)
    for _ in range(4):
        assert c.get("/ok", {"X-Key": "k"})[0] == 200
    c.close()
    assert app.gate.stats["reused"] == 3
    wait_in_flight(client, "one", 0)  # released after 0.5 s waiting
    assert app.gate.leases_waiting() == 0
    after = counters(client, "one")
    assert after["accepted"] - before["accepted"] == 4
    assert client.policies()["one"].state["renewed"] == 3


def test_outcomes_reported_from_the_response(sluice, apps):
    client = sluice.client()
    app = apps("one", target=sluice.grpc_target)
    base = counters(client, "one")
    c = Http(app.port)
    assert c.get("/status/503")[0] == 503
    wait_counter(client, "one", "dropped", base["dropped"] + 1)
    assert c.get("/status/504")[0] == 504
    wait_counter(client, "one", "dropped", base["dropped"] + 2)
    c.close()
    assert get(app.port, "/boom")[0] == 500  # raised: failed (ignored by the limit)
    wait_counter(client, "one", "ignored", base["ignored"] + 1)
    c = Http(app.port)
    assert c.get("/status/404")[0] == 404
    assert c.get("/choose")[0] == 200
    wait_counter(client, "one", "dropped", base["dropped"] + 3)
    assert c.get("/sleep")[0] == 200
    wait_in_flight(client, "one", 0)
    now = counters(client, "one")
    assert now["accepted"] - base["accepted"] == 6
    assert now["ignored"] == base["ignored"] + 1 and now["dropped"] == base["dropped"] + 3
    ((adm, state_adm),) = app.admissions
    assert adm is state_adm  # current_admission() and request.state.sluice
    assert adm.released_outcome == "success"
    assert 0.2 <= adm.rtt < 2.0, adm.rtt
    c.close()


def test_client_gone_releases_the_lease(sluice, apps):
    client = sluice.client()
    app = apps("one", target=sluice.grpc_target)
    base = counters(client, "one")
    c = Http(app.port)
    c.conn.request("GET", "/slow")
    assert app.entered.wait(5)
    wait_in_flight(client, "one", 1)
    c.conn.sock.close()  # the client gives up before the answer
    c.close()
    app.proceed.set()
    wait_in_flight(client, "one", 0)
    assert counters(client, "one")["accepted"] == base["accepted"] + 1


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
    status, _, body = get(app.port, "/ok")
    assert (status, body) == (200, b"ok")
    assert get(app.port, "/ok")[0] == 200
    assert app.calls == 2
    assert app.gate.stats["unchecked"] == 2


def test_unreachable_server_fails_closed_when_asked(apps):
    app = apps("one", target=closed_port_target(), fail_open=False, unreachable_retry=2.5)
    status, headers, body = get(app.port, "/ok")
    assert status == 503
    assert headers["retry-after"] == "3"
    assert problem_of(headers, body)["type"] == "urn:sluice:problem:admission-unavailable"
    assert app.calls == 0
