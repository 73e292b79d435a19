"""Rate policies over gRPC: Check, Peek, CheckMany (default config: api-rate is GCRA 100/s in
bursts of 20; per-minute is a sliding window of 1000 per minute)."""

import math
import time

from sluice_client import CheckManyResult, Decision


def test_check_allows_the_burst_then_denies(client, key):
    k = key()
    first = client.check("api-rate", k)
    assert first == Decision(True, 20, 19, first.reset_after, 0.0)
    assert 0 < first.reset_after <= 0.011  # one hit's worth: 10 ms

    # GCRA refills one hit per 10 ms while we call: count the allowed ones until a denial.
    start = time.monotonic()
    allowed = 1
    for _ in range(1000):
        d = client.check("api-rate", k)
        if not d.allowed:
            break
        allowed += 1
    elapsed = time.monotonic() - start
    assert not d.allowed, "api-rate never denied"
    assert 20 <= allowed <= 20 + math.ceil(elapsed * 100) + 1
    assert d.remaining == 0
    assert d.retry_after is not None and 0 < d.retry_after <= 0.011
    assert d.reset_after > 0.15  # nearly the whole burst to refill


def test_check_exact_limit_on_sliding_window(client, key):
    k = key()
    d = client.check("per-minute", k, hits=999)
    # reset_after is the rest of this window plus the next one: within 2 s of the window's end,
    # the checks below could straddle it (then the 999 weigh in the previous window and the
    # wait is short), so start over just after it.
    if d.reset_after - 60 < 2:
        time.sleep(d.reset_after - 60 + 0.05)
        k = key()
        d = client.check("per-minute", k, hits=999)
    assert d.allowed and d.remaining == 1 and d.limit == 1000
    d = client.check("per-minute", k)
    assert d.allowed and d.remaining == 0
    d = client.check("per-minute", k)
    assert not d.allowed
    assert d.retry_after is not None and d.retry_after > 1  # the window has to slide a lot


def test_denied_check_spends_nothing(client, key):
    k = key()
    assert client.check("per-minute", k, hits=990).allowed
    assert not client.check("per-minute", k, hits=11).allowed  # 990 + 11 > 1000
    d = client.check("per-minute", k, hits=10)  # the 11 were not spent
    assert d.allowed and d.remaining == 0


def test_peek_consumes_nothing(client, key):
    k = key()
    for _ in range(50):  # more than the burst: any debit would show
        d = client.peek("api-rate", k)
        assert d.allowed and d.remaining == 19
    assert client.check("api-rate", k, hits=20).allowed  # still the whole burst

    k = key()
    for _ in range(10):
        assert client.peek("per-minute", k, hits=5).remaining == 995
    assert client.check("per-minute", k).remaining == 999
    assert client.peek("per-minute", k).remaining == 998


def test_peek_reports_a_denial_without_changing_it(client, key):
    k = key()
    assert client.check("per-minute", k, hits=1000).allowed
    for _ in range(3):
        d = client.peek("per-minute", k)
        assert not d.allowed and d.retry_after > 0


def test_more_hits_than_the_limit_can_never_pass(client, key):
    k = key()
    for call in (client.check, client.peek):
        d = call("api-rate", k, hits=21)  # burst 20
        assert not d.allowed
        assert d.retry_after is None
    d = client.check("per-minute", k, hits=1001)
    assert not d.allowed and d.retry_after is None
    # Not a matter of exhaustion: the whole burst at once passes on the same (fresh) key.
    assert client.check("api-rate", k, hits=20).allowed


def test_check_many_all_pass_and_all_are_debited(client, key):
    a, b = key(), key()
    r = client.check_many([("per-minute", a, 10), ("per-minute", b, 20), ("api-rate", a)])
    assert isinstance(r, CheckManyResult)
    allowed, decisions, denied_index = r
    assert allowed and denied_index is None
    assert [d.allowed for d in decisions] == [True, True, True]
    assert client.peek("per-minute", a).remaining == 989
    assert client.peek("per-minute", b).remaining == 979


def test_check_many_is_all_or_nothing(client, key):
    first, exhausted = key(), key()
    assert client.check("per-minute", exhausted, hits=1000).allowed
    r = client.check_many([("per-minute", first, 500), ("per-minute", exhausted, 1)])
    assert not r.allowed
    assert r.denied_index == 1
    assert len(r.decisions) == 2
    assert r.decisions[0].allowed and r.decisions[0].remaining == 500  # checked, then refunded
    assert not r.decisions[1].allowed
    # The first key was not debited.
    assert client.peek("per-minute", first).remaining == 999
    assert client.check("per-minute", first, hits=1000).allowed


def test_check_many_refunds_a_gcra_key(client, key):
    first, other = key(), key()
    r = client.check_many([("api-rate", first, 20), ("api-rate", other, 21), ("api-rate", key())])
    assert (r.allowed, r.denied_index, len(r.decisions)) == (False, 1, 2)
    assert r.decisions[1].retry_after is None
    # Debited and not refunded, the first key would have ~0 left (one hit back per 10 ms).
    assert client.peek("api-rate", first).remaining == 19
    assert client.check("api-rate", first, hits=20).allowed


def test_check_many_with_one_key_twice(client, key):
    k = key()
    r = client.check_many([("per-minute", k, 600), ("per-minute", k, 600)])
    assert (r.allowed, r.denied_index) == (False, 1)
    assert r.decisions[0].remaining == 400  # the second check saw the first one's debit
    assert client.peek("per-minute", k).remaining == 999

    r = client.check_many([("per-minute", k, 5), ("per-minute", k, 5)])
    assert r.allowed and [d.remaining for d in r.decisions] == [995, 990]


def test_check_many_refund_restores_exactly_what_it_took(client, key):
    k, exhausted = key(), key()
    assert client.check("per-minute", k, hits=400).allowed
    assert client.check("per-minute", exhausted, hits=1000).allowed
    r = client.check_many([("per-minute", k, 400), ("per-minute", exhausted)])
    assert not r.allowed
    assert client.peek("per-minute", k).remaining == 599  # not 999: only the batch's 400 back


def test_retry_after_and_reset_after_are_honest(client, key):
    k = key()
    assert client.check("api-rate", k, hits=20).allowed
    # The burst spent: a check is refused until one emission interval (10 ms at 100/s) has
    # passed since the last; on a loaded machine the next call may come later and pass.
    for _ in range(5):
        d = client.check("api-rate", k)
        if not d.allowed:
            break
    assert not d.allowed and 0 < d.retry_after <= 0.011
    time.sleep(d.retry_after + 0.002)
    assert client.check("api-rate", k).allowed  # it passes once retry_after has passed

    full = client.peek("api-rate", k)
    assert 0 < full.reset_after <= 0.21
    time.sleep(full.reset_after + 0.002)
    assert client.peek("api-rate", k).remaining == 19  # whole again: as fresh as a new key
    assert client.check("api-rate", k, hits=20).allowed


def test_unset_hits_on_the_wire_means_one(server, key):
    import grpc
    from sluice.v1 import sluice_pb2, sluice_pb2_grpc

    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = sluice_pb2_grpc.SluiceStub(channel)
        request = sluice_pb2.CheckRequest(policy="per-minute", key=key())
        assert not request.HasField("hits")
        d = stub.Check(request, timeout=5).decision
        assert d.allowed and d.remaining == 999


def test_a_new_key_refused_at_max_keys_says_why_on_every_path(start_server):
    """Past max_keys a new key's 429 names key_capacity and the policy's detail, over HTTP,
    gRPC and the CLI (it came with no reason)."""
    import subprocess

    from conftest import sluice_bin

    server = start_server("policies:\n  tiny: {kind: rate, limit: 5, period: 1h, max_keys: 2}\n")
    for k in ("a", "b"):
        assert server.http("POST", "/v1/check", body={"policy": "tiny", "key": k}).status == 200
    r = server.http("POST", "/v1/check", body={"policy": "tiny", "key": "c"})
    assert r.status == 429, r
    assert r.json()["reason"] == "key_capacity", r.json()
    assert "max_keys (2)" in r.json()["detail"], r.json()
    d = server.client().check("tiny", "c")
    assert not d.allowed and d.reason == "key_capacity" and "max_keys (2)" in d.detail, d
    out = subprocess.run([sluice_bin(), "check", "tiny", "c", "--server", server.grpc_target],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "key_capacity" in out.stdout + out.stderr, out
