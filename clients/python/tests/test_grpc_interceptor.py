"""The gRPC server interceptor (sluice_client.grpc_interceptor) on a real grpc.server with a
generic bytes-in, bytes-out service, called over a real channel, against a real `sluice serve`:
RESOURCE_EXHAUSTED / UNAVAILABLE with the refusal in the message and the trailing metadata,
leases released with the status code's outcome (and a client's passed deadline), streams held
to their end, health checks not admitted, failing open and closed."""

from __future__ import annotations

import json
import threading
import time
from concurrent import futures

import grpc
import pytest

from adapter_support import (CONFIG, closed_port_target, counters, wait_counter,  # noqa: E402
                             wait_in_flight)
from sluice_client.adapters import current_admission, header  # noqa: E402
from sluice_client.grpc_interceptor import SluiceServerInterceptor  # noqa: E402


class Service:
    """test.Echo: Say (unary), Slow, Fail (aborts with the code named in the request), Boom,
    Sleep, Choose, Count (server streaming); and grpc.health.v1.Health/Check, never admitted."""

    def __init__(self, policy: str, **options):
        self.calls = 0
        self.entered = threading.Event()
        self.proceed = threading.Event()
        self.admissions = []
        self.interceptor = SluiceServerInterceptor(policy, **options)
        self.server = grpc.server(futures.ThreadPoolExecutor(8),
                                  interceptors=[self.interceptor])  # the one line
        unary = grpc.unary_unary_rpc_method_handler
        self.server.add_generic_rpc_handlers([
            grpc.method_handlers_generic_handler("test.Echo", {
                "Say": unary(self.say), "Slow": unary(self.slow), "Fail": unary(self.fail),
                "Boom": unary(self.boom), "Sleep": unary(self.sleep),
                "Choose": unary(self.choose),
                "Count": grpc.unary_stream_rpc_method_handler(self.count)}),
            grpc.method_handlers_generic_handler("grpc.health.v1.Health",
                                                 {"Check": unary(self.say)})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    def call(self, method: str, request: bytes = b"hi", timeout: float = 10.0,
             metadata=None, service: str = "test.Echo"):
        return self.channel.unary_unary(f"/{service}/{method}")(
            request, timeout=timeout, metadata=metadata)

    def error(self, method: str, request: bytes = b"hi", **kw) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            self.call(method, request, **kw)
        return info.value

    # ---- handlers ----

    def say(self, request, context):
        self.calls += 1
        return request

    def slow(self, request, context):
        self.calls += 1
        self.entered.set()
        self.proceed.wait(10)
        return b"slow"

    def fail(self, request, context):
        self.calls += 1
        context.abort(getattr(grpc.StatusCode, request.decode()), "as asked")

    def boom(self, request, context):
        self.calls += 1
        raise RuntimeError("boom")

    def sleep(self, request, context):
        self.calls += 1
        self.admissions.append(current_admission())
        time.sleep(float(request.decode()))
        return b"slept"

    def choose(self, request, context):
        self.calls += 1
        current_admission().outcome = "dropped"
        return b"chose"

    def count(self, request, context):
        self.calls += 1
        for i in range(int(request.decode())):
            self.entered.set()
            self.proceed.wait(10)
            yield str(i).encode()

    def stop(self):
        self.channel.close()
        self.server.stop(None)
        self.interceptor.gate.close()


def trailers(err: grpc.RpcError) -> dict:
    return dict(err.trailing_metadata() or ())


@pytest.fixture
def sluice(start_server):
    return start_server(CONFIG)


@pytest.fixture
def services():
    started = []

    def make(policy, **options):
        s = Service(policy, **options)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def test_rate_policy_keyed_by_metadata_refuses_with_resource_exhausted(sluice, services):
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
    problem = json.loads(t["sluice-problem"])
    assert problem["status"] == 429 and problem["policy"] == "rate2"
    assert svc.calls == 2, "a refused call must not reach the handler"
    assert svc.call("Say", b"4", metadata=[("x-api-key", "bob")]) == b"4"


def test_rate_policy_keyed_by_method_and_health_never_admitted(sluice, services):
    svc = services("rate2", target=sluice.grpc_target)
    assert svc.call("Say") == b"hi" and svc.call("Say") == b"hi"
    assert svc.error("Say").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert svc.call("Choose") == b"chose"  # /test.Echo/Choose: another key
    for _ in range(5):
        assert svc.call("Check", service="grpc.health.v1.Health") == b"hi"


@pytest.mark.parametrize("background", [False, True], ids=["release", "background_release"])
def test_concurrency_policy_refuses_with_unavailable_and_releases(sluice, services, background):
    client = sluice.client()
    svc = services("one", target=sluice.grpc_target, background_release=background)
    before = counters(client, "one")
    results = []
    t = threading.Thread(target=lambda: results.append(svc.call("Slow")))
    t.start()
    assert svc.entered.wait(5)
    wait_in_flight(client, "one", 1)
    err = svc.error("Say")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert err.details().startswith("Concurrency Limit Exceeded: ")
    t_md = trailers(err)
    assert t_md["retry-after"] == "1" and t_md["grpc-retry-pushback-ms"] == "1000"
    assert json.loads(t_md["sluice-problem"])["type"] == \
        "urn:sluice:problem:concurrency-limit-exceeded"
    assert svc.calls == 1
    svc.proceed.set()
    t.join(10)
    assert results == [b"slow"]
    wait_in_flight(client, "one", 0)
    after = counters(client, "one")
    assert after["accepted"] - before["accepted"] == 1
    assert after["rejected"] - before["rejected"] == 1


def test_outcomes_reported_from_the_status_code(sluice, services):
    client = sluice.client()
    svc = services("one", target=sluice.grpc_target)
    base = counters(client, "one")
    assert svc.error("Fail", b"UNAVAILABLE").code() == grpc.StatusCode.UNAVAILABLE  # overload
    wait_counter(client, "one", "dropped", base["dropped"] + 1)
    assert svc.error("Fail", b"RESOURCE_EXHAUSTED").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    wait_counter(client, "one", "dropped", base["dropped"] + 2)
    assert svc.error("Fail", b"INTERNAL").code() == grpc.StatusCode.INTERNAL  # failed
    wait_counter(client, "one", "ignored", base["ignored"] + 1)
    assert svc.error("Boom").code() == grpc.StatusCode.UNKNOWN  # raised: failed
    wait_counter(client, "one", "ignored", base["ignored"] + 2)
    assert svc.error("Fail", b"NOT_FOUND").code() == grpc.StatusCode.NOT_FOUND  # a success
    assert svc.call("Choose") == b"chose"  # the handler chose "dropped"
    wait_counter(client, "one", "dropped", base["dropped"] + 3)
    assert svc.call("Sleep", b"0.2") == b"slept"
    wait_in_flight(client, "one", 0)
    now = counters(client, "one")
    assert now["accepted"] - base["accepted"] == 7
    assert now["dropped"] == base["dropped"] + 3 and now["ignored"] == base["ignored"] + 2
    (adm,) = svc.admissions
    assert adm.released_outcome == "success" and 0.2 <= adm.rtt < 2.0, adm


def test_deadline_passed_is_a_timeout(sluice, services):
    client = sluice.client()
    svc = services("one", target=sluice.grpc_target)
    base = counters(client, "one")
    assert svc.error("Sleep", b"0.5", timeout=0.2).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_in_flight(client, "one", 0, timeout=5)
    wait_counter(client, "one", "dropped", base["dropped"] + 1)
    (adm,) = svc.admissions
    assert adm.released_outcome == "timeout"


def test_stream_holds_its_lease_to_the_end(sluice, services):
    client = sluice.client()
    svc = services("one", target=sluice.grpc_target)
    stream = svc.channel.unary_stream("/test.Echo/Count")(b"3", timeout=10)
    assert svc.entered.wait(5)
    wait_in_flight(client, "one", 1)
    assert svc.error("Say").code() == grpc.StatusCode.UNAVAILABLE
    svc.proceed.set()
    assert list(stream) == [b"0", b"1", b"2"]
    wait_in_flight(client, "one", 0)


def test_unreachable_server_fails_open_by_default(services):
    svc = services("one", target=closed_port_target())
    assert svc.call("Say") == b"hi" and svc.call("Say") == b"hi"
    assert svc.interceptor.gate.stats["unchecked"] == 2


def test_unreachable_server_fails_closed_when_asked(services):
    svc = services("one", target=closed_port_target(), fail_open=False)
    err = svc.error("Say")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert err.details().startswith("Admission Control Unavailable")
    assert trailers(err)["retry-after"] == "1"
    assert svc.calls == 0


def test_a_methods_wrapped_handler_is_made_once_and_reads_each_calls_metadata():
    """The interceptor wraps a method's handler once (not per call) while the server hands it
    the same handler, and a new one when the handler changes; the key comes from each call's
    own metadata (test_rate_policy_keyed_by_metadata... calls through it with two keys)."""
    interceptor = SluiceServerInterceptor("p", target=closed_port_target())
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)

    class Details:
        method = "/test.Echo/Say"
        invocation_metadata = ()

    first = interceptor.intercept_service(lambda d: handler, Details())
    assert first is not handler and first.unary_unary is not None
    assert interceptor.intercept_service(lambda d: handler, Details()) is first
    other = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    assert interceptor.intercept_service(lambda d: other, Details()) is not first
    health = type("Health", (), {"method": "/grpc.health.v1.Health/Check",
                                 "invocation_metadata": ()})()
    assert interceptor.intercept_service(lambda d: handler, health) is handler  # skipped
    interceptor.gate.close()
