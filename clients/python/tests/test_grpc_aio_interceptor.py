"""The grpc.aio server interceptor (sluice_client.grpc_interceptor.SluiceAioServerInterceptor) on
a real grpc.aio.server running its own event loop in a thread, called over a real channel,
against a real `sluice serve`: refusals with their trailing metadata, leases held to the end of
each kind of handler (coroutine, async generator, a coroutine that writes its stream, a
synchronous function) and released with the status code's outcome, health checks not admitted,
failing open and closed, and an allowance spent on the loop."""

from __future__ import annotations

import asyncio
import json
import threading

import grpc
import pytest

from adapter_support import (CONFIG, closed_port_target, counters, wait_counter,  # noqa: E402
                             wait_in_flight)
from conftest import wait_until  # noqa: E402
from sluice_client.adapters import current_admission, header  # noqa: E402
from sluice_client.grpc_interceptor import SluiceAioServerInterceptor  # noqa: E402


class AioService:
    """test.Echo on grpc.aio: Say, Slow (until let go), Fail (aborts with the code the request
    names), Boom, Choose (chooses "dropped"), SyncSay (a synchronous handler), Count (an async
    generator), Write (a coroutine writing its stream); grpc.health.v1.Health/Check."""

    def __init__(self, policy: str, **options):
        self.calls = 0
        self.entered = threading.Event()
        self.proceed = threading.Event()
        self.admissions = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.interceptor = SluiceAioServerInterceptor(policy, **options)
        self.port = self.run(self._start())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    def run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> int:
        self.server = grpc.aio.server(interceptors=[self.interceptor])  # the one line
        unary = grpc.unary_unary_rpc_method_handler
        stream = grpc.unary_stream_rpc_method_handler
        self.server.add_generic_rpc_handlers([
            grpc.method_handlers_generic_handler("test.Echo", {
                "Say": unary(self.say), "Slow": unary(self.slow), "Fail": unary(self.fail),
                "Boom": unary(self.boom), "Choose": unary(self.choose),
                "SyncSay": unary(self.sync_say), "Count": stream(self.count),
                "Write": stream(self.write)}),
            grpc.method_handlers_generic_handler("grpc.health.v1.Health",
                                                 {"Check": unary(self.say)})])
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    def call(self, method: str, request: bytes = b"hi", timeout: float = 10.0, metadata=None,
             service: str = "test.Echo"):
        return self.channel.unary_unary(f"/{service}/{method}")(request, timeout=timeout,
                                                                 metadata=metadata)

    def stream(self, method: str, request: bytes, timeout: float = 10.0):
        return self.channel.unary_stream(f"/test.Echo/{method}")(request, timeout=timeout)

    def error(self, method: str, request: bytes = b"hi", **kw) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            self.call(method, request, **kw)
        return info.value

    # ---- handlers ----

    async def say(self, request, context):
        self.calls += 1
        return request

    async def slow(self, request, context):
        self.calls += 1
        self.entered.set()
        await asyncio.to_thread(self.proceed.wait, 10)
        return b"slow"

    async def fail(self, request, context):
        self.calls += 1
        await context.abort(getattr(grpc.StatusCode, request.decode()), "as asked")

    async def boom(self, request, context):
        self.calls += 1
        raise RuntimeError("boom")

    async def choose(self, request, context):
        self.calls += 1
        current_admission().outcome = "dropped"
        return b"chose"

    def sync_say(self, request, context):
        self.calls += 1
        self.admissions.append(current_admission())  # the admission's context, in a thread
        return b"sync " + request

    async def count(self, request, context):
        self.calls += 1
        for i in range(int(request.decode())):
            self.entered.set()
            await asyncio.to_thread(self.proceed.wait, 10)
            yield str(i).encode()

    async def write(self, request, context):
        self.calls += 1
        for i in range(int(request.decode())):
            await context.write(f"w{i}".encode())

    def stop(self):
        self.channel.close()
        self.run(self.server.stop(None))
        self.run(self.interceptor.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def trailers(err: grpc.RpcError) -> dict:
    return dict(err.trailing_metadata() or ())


@pytest.fixture
def sluice(start_server):
    return start_server(CONFIG)


@pytest.fixture
def services():
    started = []

    def make(policy, **options):
        s = AioService(policy, **options)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def test_rate_policy_refuses_with_resource_exhausted_and_its_trailers(sluice, services):
    svc = services("rate2", target=sluice.grpc_target, key=header("x-api-key"))
    md = [("x-api-key", "alice")]
    assert svc.call("Say", b"1", metadata=md) == b"1"
    assert svc.call("Say", b"2", metadata=md) == b"2"
    err = svc.error("Say", b"3", metadata=md)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details().startswith("Rate Limit Exceeded: Rate policy rate2: ")
    t = trailers(err)
    assert 1 <= int(t["retry-after"]) <= 3600
    assert int(t["grpc-retry-pushback-ms"]) > 0
    assert json.loads(t["sluice-problem"])["policy"] == "rate2"
    assert svc.calls == 2, "a refused call must not reach the handler"
    assert svc.call("Say", b"4", metadata=[("x-api-key", "bob")]) == b"4"
    for _ in range(3):  # the health service is never admitted
        assert svc.call("Check", service="grpc.health.v1.Health") == b"hi"


def test_concurrency_policy_refuses_with_unavailable_and_releases(sluice, services):
    client = sluice.client()
    svc = services("one", target=sluice.grpc_target)
    before = counters(client, "one")
    results = []
    t = threading.Thread(target=lambda: results.append(svc.call("Slow")))
    t.start()
    assert svc.entered.wait(5)
    wait_in_flight(client, "one", 1)
    err = svc.error("Say")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert err.details().startswith("Concurrency Limit Exceeded: ")
    assert trailers(err)["retry-after"] == "1"
    assert svc.calls == 1
    svc.proceed.set()
    t.join(10)
    assert results == [b"slow"]
    wait_in_flight(client, "one", 0)
    after = counters(client, "one")
    assert after["accepted"] - before["accepted"] == 1
    assert after["rejected"] - before["rejected"] == 1


def test_every_kind_of_handler_is_released_with_its_outcome(sluice, services):
    client = sluice.client()
    svc = services("one", target=sluice.grpc_target)
    base = counters(client, "one")
    assert svc.error("Fail", b"UNAVAILABLE").code() == grpc.StatusCode.UNAVAILABLE  # overload
    wait_counter(client, "one", "dropped", base["dropped"] + 1)
    assert svc.error("Fail", b"INTERNAL").code() == grpc.StatusCode.INTERNAL  # failed
    wait_counter(client, "one", "ignored", base["ignored"] + 1)
    assert svc.error("Boom").code() == grpc.StatusCode.UNKNOWN  # raised: failed
    wait_counter(client, "one", "ignored", base["ignored"] + 2)
    assert svc.error("Fail", b"NOT_FOUND").code() == grpc.StatusCode.NOT_FOUND  # a success
    assert svc.call("Choose") == b"chose"  # the handler chose "dropped"
    wait_counter(client, "one", "dropped", base["dropped"] + 2)
    assert svc.call("SyncSay", b"x") == b"sync x"
    (adm,) = svc.admissions
    assert adm is not None and adm.lease is not None
    assert [m for m in svc.stream("Write", b"3")] == [b"w0", b"w1", b"w2"]
    wait_in_flight(client, "one", 0)
    now = counters(client, "one")
    assert now["accepted"] - base["accepted"] == 7
    assert now["dropped"] == base["dropped"] + 2 and now["ignored"] == base["ignored"] + 2
    assert adm.released_outcome == "success"


def test_a_stream_holds_its_lease_to_its_end(sluice, services):
    client = sluice.client()
    svc = services("one", target=sluice.grpc_target)
    it = svc.stream("Count", b"2")
    results = []
    t = threading.Thread(target=lambda: results.extend(it))
    t.start()
    assert svc.entered.wait(5)
    wait_in_flight(client, "one", 1)  # the stream is open: its lease is held
    assert svc.error("Say").code() == grpc.StatusCode.UNAVAILABLE
    svc.proceed.set()
    t.join(10)
    assert results == [b"0", b"1"]
    wait_in_flight(client, "one", 0)


def test_an_unreachable_server_fails_open_or_closed_as_told(services):
    target = closed_port_target()
    opened = services("one", target=target)
    assert opened.call("Say") == b"hi"
    assert opened.interceptor.gate.stats["unchecked"] == 1
    closed = services("one", target=target, fail_open=False)
    err = closed.error("Say")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert json.loads(trailers(err)["sluice-problem"])["type"] == \
        "urn:sluice:problem:admission-unavailable"
    assert closed.calls == 0
    with pytest.raises(TypeError, match="client"):
        SluiceAioServerInterceptor("one", client=object())


def test_an_allowance_admits_on_the_loop_without_a_round_trip(sluice, services):
    svc = services("rate2", target=sluice.grpc_target, key=header("x-api-key"), allowance=2,
                   allowance_hold=60)
    md = [("x-api-key", "carol")]
    assert svc.call("Say", b"1", metadata=md) == b"1"
    assert svc.call("Say", b"2", metadata=md) == b"2"
    assert svc.error("Say", b"3", metadata=md).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    gate = svc.interceptor.gate
    stats = gate.allowances.stats
    assert stats["blocks_granted"] == 1 and stats["local_admits"] == 1
    # The second call left none of the block's 2: a refill went, on the loop's grpc.aio
    # channel (no synchronous channel, and its threads, made for it); refused, as none remain.
    wait_until(lambda: gate.refills_in_flight() == 0, 5, what="the refill's answer")
    assert stats["refills_refused"] == 1 and stats["refills_granted"] == 0
    assert gate.client is None
