"""sluice_client.throttler against a scripted in-process HTTP server (no sluice serve): what a
check answers for each status and body, the arguments it sends, the kept-alive connection, the
backoff's delays and the waiting helpers' deadlines. Time is a fake clock the fake sleep
advances, so nothing here really sleeps (one test waits out a 0.2 s socket timeout)."""

from __future__ import annotations

import json
import math
import random
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple, Union
from urllib.parse import parse_qs, urlsplit

import pytest

from sluice_client import (Backoff, CheckResult, ChunkStats, SluiceError, ThrottledTimeout,
                           ThrottlerClient, run_in_chunks, wait_until_allowed)


# ---- the scripted server ----

@dataclass
class Answer:
    """One scripted answer. `body`: a dict is sent as JSON, a str or bytes as is."""

    status: int = 200
    body: Union[dict, str, bytes] = field(default_factory=dict)
    drop_after: bool = False  # close the connection after answering, without saying so
    drop_before: bool = False  # close the connection without answering
    hang: bool = False  # answer nothing until the test ends


def answer(status: int = 200, reason: Optional[str] = None, value: Optional[float] = None,
           threshold: float = 1.0, metric: str = "lag", message: str = "", **kw) -> Answer:
    """An answer shaped like the server's: the Vitess fields and sluice's lower-case ones."""
    reason = reason or {200: "ok", 429: "threshold_exceeded", 417: "app_throttled"}[status]
    body = {"StatusCode": status, "Value": value if value is not None else 0,
            "Threshold": threshold, "Message": message, "RecentlyChecked": True,
            "AppName": "purge", "MetricName": metric, "Scope": "shard",
            "Metrics": {metric: {"StatusCode": status, "Value": value, "Threshold": threshold,
                                 "Message": message}},
            "reason": reason, "value": value, "threshold": threshold}
    return Answer(status, body, **kw)


@dataclass
class Seen:
    method: str
    path: str
    query: Dict[str, List[str]]
    peer: Tuple[str, int]  # the client's address: one per connection


class ScriptedServer:
    """A ThreadingHTTPServer on 127.0.0.1:0 that gives `answers` in order (the last repeats)."""

    def __init__(self, answers: List[Answer]):
        assert answers
        self.answers = list(answers)
        self.seen: List[Seen] = []
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.script = self
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def next_answer(self, handler: BaseHTTPRequestHandler) -> Answer:
        parts = urlsplit(handler.path)
        with self._lock:
            self.seen.append(Seen(handler.command, parts.path, parse_qs(parts.query),
                                  handler.client_address))
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    @property
    def connections(self) -> int:
        return len({s.peer for s in self.seen})

    def stop(self) -> None:
        self.released.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK

    def do_GET(self) -> None:
        script: ScriptedServer = self.server.script
        a = script.next_answer(self)
        if a.hang:
            script.released.wait(10)
        if a.hang or a.drop_before:
            self.close_connection = True
            return
        body = a.body
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        self.send_response(a.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if a.drop_after:
            self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def serve():
    servers: List[ScriptedServer] = []

    def start(*answers: Answer) -> ScriptedServer:
        s = ScriptedServer(list(answers))
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def clients():
    """Makes ThrottlerClients and closes them at teardown."""
    made: List[ThrottlerClient] = []

    def make(url: str, app: str = "purge", **kw) -> ThrottlerClient:
        c = ThrottlerClient(url, app, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


class FakeClock:
    """time.monotonic and time.sleep: sleeping advances the clock, and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: List[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def closed_port_url() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ---- one check ----

def test_ok_carries_the_bodys_fields_and_sends_only_the_app(serve, clients):
    server = serve(answer(200, value=0.4, threshold=1.0, metric="lag", message="fine"))
    r = clients(server.url).check()
    assert r == CheckResult(ok=True, status=200, reason="ok", value=0.4, threshold=1.0,
                            metric="lag", message="fine")
    assert not r.unreachable
    (seen,) = server.seen
    assert seen.method == "GET" and seen.path == "/throttler/check"
    assert seen.query == {"app": ["purge"]}


def test_shard_scope_and_low_priority_are_sent(serve, clients):
    server = serve(answer(200))
    clients(server.url + "/sluice/", "purge job", shard="main", scope="self",
            low_priority=True).check()
    (seen,) = server.seen
    assert seen.path == "/sluice/throttler/check"  # a path prefix is kept
    assert seen.query == {"app": ["purge job"], "shard": ["main"], "scope": ["self"],
                          "p": ["low"]}


def test_429_is_a_refusal_with_the_value_and_threshold(serve, clients):
    server = serve(answer(429, value=1.7, threshold=1.0, message="lag 1.7 is over 1"))
    r = clients(server.url, on_unreachable="proceed").check()
    assert not r.ok and r.status == 429 and r.reason == "threshold_exceeded"
    assert (r.value, r.threshold, r.metric) == (1.7, 1.0, "lag")
    assert r.message == "lag 1.7 is over 1" and not r.unreachable


def test_417_app_throttled_is_a_refusal_then_waited_out(serve, clients):
    server = serve(answer(417), answer(200))
    client = clients(server.url, on_unreachable="proceed")  # a 417 is an answer: never proceed
    r = client.check()
    assert not r.ok and r.status == 417 and r.reason == "app_throttled"
    clock = FakeClock()
    r = wait_until_allowed(client, deadline=10, backoff=Backoff(jitter=0), clock=clock,
                           sleep=clock.sleep)
    assert r.ok and clock.sleeps == []
    server.answers = [answer(417), answer(417), answer(200)]
    r = wait_until_allowed(client, deadline=10, backoff=Backoff(jitter=0), clock=clock,
                           sleep=clock.sleep)
    assert r.ok and clock.sleeps == [1.0, 2.0]


def test_404_and_400_are_refusals_whatever_on_unreachable_says(serve, clients):
    server = serve(Answer(404, {"StatusCode": 404, "Message": "no metric 'x'",
                                "reason": "unknown_metric"}),
                   Answer(400, {"StatusCode": 400, "Message": "scope: must be self or shard"}))
    client = clients(server.url, on_unreachable="proceed")
    r = client.check()
    assert (r.ok, r.status, r.reason, r.message) == (False, 404, "unknown_metric",
                                                     "no metric 'x'")
    r = client.check()
    assert (r.ok, r.status, r.reason) == (False, 400, "bad_request")  # no reason: the status's
    assert r.value is None and r.metric is None


# ---- unreachable ----

def test_a_closed_port_holds_by_default_and_proceeds_when_configured(clients):
    url = closed_port_url()
    r = clients(url).check()
    assert not r.ok and r.status == 0 and r.unreachable
    assert r.reason.startswith("unreachable: ConnectionRefusedError"), r
    assert url in r.message
    r = clients(url, on_unreachable="proceed").check()
    assert r.ok and r.status == 0 and r.unreachable


def test_an_unreachable_throttler_is_waited_out_until_the_deadline(clients):
    clock = FakeClock()
    with pytest.raises(ThrottledTimeout) as info:
        wait_until_allowed(clients(closed_port_url()), deadline=3, backoff=Backoff(jitter=0),
                           clock=clock, sleep=clock.sleep)
    assert info.value.result.unreachable and info.value.result.status == 0
    assert clock.sleeps == [1.0, 2.0]


@pytest.mark.parametrize("status,body,why", [
    (500, {"StatusCode": 500, "Message": "boom"}, "unreachable: HTTP 500: boom"),
    (503, "draining", "unreachable: HTTP 503: draining"),
    (502, "", "unreachable: HTTP 502"),
])
def test_a_5xx_is_unreachable(serve, clients, status, body, why):
    server = serve(Answer(status, body))
    r = clients(server.url).check()
    assert (r.ok, r.status, r.reason) == (False, status, why)
    assert r.unreachable
    r = clients(server.url, on_unreachable="proceed").check()
    assert (r.ok, r.status, r.reason) == (True, status, why)


@pytest.mark.parametrize("body", ["<html>hello</html>", '{"StatusCode": 200, "reason"', "[1, 2]",
                                  "", b"\xff\xfe"])
def test_an_answer_that_is_not_a_json_object_is_unreachable(serve, clients, body):
    server = serve(Answer(200, body))
    r = clients(server.url).check()
    assert not r.ok and r.status == 200 and r.unreachable
    assert "not a JSON object" in r.reason
    assert clients(server.url, on_unreachable="proceed").check().ok


def test_a_timeout_is_unreachable_and_the_next_check_reconnects(serve, clients):
    server = serve(Answer(hang=True), answer(200))
    client = clients(server.url, timeout=0.2)
    r = client.check()
    assert not r.ok and r.status == 0 and r.unreachable
    assert "timed out" in r.reason, r
    assert client.check().ok
    assert server.connections == 2


# ---- the connection ----

def test_one_kept_alive_connection_serves_every_check(serve, clients):
    server = serve(answer(429, value=2.0), answer(429, value=1.5), answer(200))
    client = clients(server.url)
    statuses = [client.check().status for _ in range(6)]
    assert statuses == [429, 429, 200, 200, 200, 200]
    assert len(server.seen) == 6 and server.connections == 1


def test_a_connection_the_server_dropped_is_reopened_once(serve, clients):
    server = serve(answer(200, drop_after=True), answer(429, value=3.0), answer(200))
    client = clients(server.url)
    assert client.check().ok
    r = client.check()  # the kept socket is dead: one reconnect, invisible to the caller
    assert r.status == 429 and r.value == 3.0
    assert client.check().ok
    assert [s.query["app"] for s in server.seen] == [["purge"]] * 3
    assert server.connections == 2


def test_a_new_connection_dropped_before_answering_is_not_retried(serve, clients):
    server = serve(Answer(drop_before=True), answer(200))
    r = clients(server.url).check()
    assert not r.ok and r.status == 0 and r.unreachable, r
    assert len(server.seen) == 1


# ---- backoff ----

def test_backoff_doubles_up_to_the_cap_and_resets():
    b = Backoff(jitter=0)
    assert [b.next_delay() for _ in range(6)] == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    b.reset()
    assert [b.next_delay() for _ in range(2)] == [1.0, 2.0]


def test_backoff_never_goes_below_min_interval():
    b = Backoff(initial=0.01, factor=2, cap=1, jitter=0, min_interval=0.1)
    assert [b.next_delay() for _ in range(6)] == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.16, 0.32])
    # Jitter below the floor is floored too.
    b = Backoff(initial=0.1, cap=0.1, jitter=0.5, min_interval=0.1, rng=random.Random(3))
    delays = [b.next_delay() for _ in range(200)]
    assert min(delays) == 0.1 and max(delays) > 0.14


def test_refused_then_allowed_sleeps_1_2_4_4_within_the_jitter(serve, clients):
    server = serve(*[answer(429, value=1.0 + i / 10) for i in range(5)], answer(200, value=0.2))
    clock = FakeClock()
    waits = []
    r = wait_until_allowed(clients(server.url), deadline=60,
                           backoff=Backoff(jitter=0.2, rng=random.Random(42)), clock=clock,
                           sleep=clock.sleep, on_wait=lambda res, d: waits.append((res.value, d)))
    assert r.ok and r.value == 0.2
    assert len(server.seen) == 6
    bases = [1, 2, 4, 4, 4]
    assert len(clock.sleeps) == 5
    for base, slept in zip(bases, clock.sleeps):
        assert base * 0.8 <= slept <= base * 1.2
    replay = random.Random(42)
    assert clock.sleeps == [base * replay.uniform(0.8, 1.2) for base in bases]
    assert waits == [(1.0 + i / 10, d) for i, d in enumerate(clock.sleeps)]


# ---- deadlines ----

def test_past_the_deadline_raises_with_the_last_result_never_sleeping_past_it(serve, clients):
    server = serve(*[answer(429, value=v) for v in (1.1, 1.2, 1.3, 1.4)])
    clock = FakeClock()
    start = clock.now
    with pytest.raises(ThrottledTimeout) as info:
        wait_until_allowed(clients(server.url), deadline=5, backoff=Backoff(jitter=0),
                           clock=clock, sleep=clock.sleep)
    # 1 s, 2 s, then the 4 s step cut to the 2 s left; a last check at the deadline.
    assert clock.sleeps == [1.0, 2.0, 2.0]
    assert clock.now == start + 5
    assert len(server.seen) == 4
    exc = info.value
    assert exc.result.value == 1.4 and exc.result.status == 429
    assert exc.deadline == 5 and exc.stats is None
    assert isinstance(exc, SluiceError) and not isinstance(exc, TimeoutError)
    assert "threshold_exceeded" in str(exc) and "lag=1.4" in str(exc)


@pytest.mark.parametrize("seed", range(5))
def test_a_jittered_wait_ends_exactly_at_the_deadline(serve, clients, seed):
    server = serve(answer(429, value=9))
    clock = FakeClock()
    start = clock.now
    with pytest.raises(ThrottledTimeout):
        wait_until_allowed(clients(server.url), deadline=7.3,
                           backoff=Backoff(rng=random.Random(seed)), clock=clock,
                           sleep=clock.sleep)
    assert math.isclose(clock.now - start, 7.3)
    assert len(server.seen) == len(clock.sleeps) + 1


def test_a_zero_deadline_checks_once(serve, clients):
    server = serve(answer(429, value=2))
    clock = FakeClock()
    with pytest.raises(ThrottledTimeout):
        wait_until_allowed(clients(server.url), deadline=0, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [] and len(server.seen) == 1


# ---- run_in_chunks ----

def test_run_in_chunks_counts_and_calls_the_chunk_exactly_as_often_as_it_asks(serve, clients):
    server = serve(
        answer(200, value=0.5),                                        # chunk 1
        answer(429, value=1.7), answer(429, value=2.5), answer(200, value=0.9),  # chunk 2
        answer(429, value=1.2), answer(200, value=0.3),                # chunk 3: backoff reset
        answer(200, value=0.1))                                        # chunk 4, the last
    clock = FakeClock()
    calls = []
    waits = []

    def chunk() -> bool:
        calls.append(len(server.seen))  # how many checks came before this chunk
        return len(calls) < 4

    stats = run_in_chunks(clients(server.url), chunk, deadline_per_chunk=30,
                          backoff=Backoff(jitter=0), clock=clock, sleep=clock.sleep,
                          on_wait=lambda r, d: waits.append((r.status, r.value, d)))
    assert calls == [1, 4, 6, 7]
    assert stats == ChunkStats(chunks=4, checks=7, refusals=3, waited_seconds=4.0,
                               max_value_seen=2.5)
    assert clock.sleeps == [1.0, 2.0, 1.0]
    assert waits == [(429, 1.7, 1.0), (429, 2.5, 2.0), (429, 1.2, 1.0)]


def test_run_in_chunks_timeout_carries_the_stats(serve, clients):
    server = serve(answer(200, value=0.5), answer(429, value=3.0))
    clock = FakeClock()
    calls = []
    with pytest.raises(ThrottledTimeout) as info:
        run_in_chunks(clients(server.url), lambda: calls.append(1) or True,
                      deadline_per_chunk=3, backoff=Backoff(jitter=0), clock=clock,
                      sleep=clock.sleep)
    assert calls == [1]  # the second chunk never ran
    assert info.value.stats == ChunkStats(chunks=1, checks=4, refusals=3, waited_seconds=3.0,
                                          max_value_seen=3.0)
    assert info.value.result.value == 3.0


def test_a_chunk_that_returns_no_bool_is_a_type_error(serve, clients):
    server = serve(answer(200))
    with pytest.raises(TypeError, match="chunk: must return True"):
        run_in_chunks(clients(server.url), lambda: None, deadline_per_chunk=1)
    assert len(server.seen) == 1


# ---- arguments ----

@pytest.mark.parametrize("kw,word", [
    ({"app": ""}, "app:"),
    ({"app": None}, "app:"),
    ({"url": "https://127.0.0.1:8080"}, "url:"),
    ({"url": "127.0.0.1:8080"}, "url:"),
    ({"url": "http://"}, "url:"),
    ({"url": "http://h:8080/?app=x"}, "url:"),
    ({"url": "http://h:port"}, "url:"),
    ({"timeout": 0}, "timeout:"),
    ({"timeout": -1}, "timeout:"),
    ({"timeout": float("inf")}, "timeout:"),
    ({"on_unreachable": "maybe"}, "on_unreachable:"),
    ({"scope": "cluster"}, "scope:"),
    ({"shard": ""}, "shard:"),
])
def test_client_arguments_are_checked(kw, word):
    args = {"url": "http://127.0.0.1:8080", "app": "purge", **kw}
    with pytest.raises(ValueError, match=word):
        ThrottlerClient(args.pop("url"), args.pop("app"), **args)


@pytest.mark.parametrize("kw,word", [
    ({"initial": 0}, "initial:"),
    ({"factor": 0.5}, "factor:"),
    ({"cap": 0.5}, "cap:"),
    ({"jitter": 1}, "jitter:"),
    ({"jitter": -0.1}, "jitter:"),
    ({"min_interval": -1}, "min_interval:"),
    ({"initial": float("nan")}, "initial:"),
])
def test_backoff_arguments_are_checked(kw, word):
    with pytest.raises(ValueError, match=word):
        Backoff(**kw)


def test_deadline_arguments_are_checked(clients):
    client = clients(closed_port_url())
    with pytest.raises(ValueError, match="deadline:"):
        wait_until_allowed(client, deadline=-1)
    with pytest.raises(ValueError, match="deadline_per_chunk:"):
        run_in_chunks(client, lambda: False, deadline_per_chunk=float("nan"))
    with pytest.raises(TypeError, match="deadline:"):
        wait_until_allowed(client, deadline="5")
