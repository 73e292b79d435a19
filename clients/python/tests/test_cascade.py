"""The cascade kind over gRPC and HTTP: Admit names the node, honours `exclude`; Release's
outcomes reach the node's health; Client.cascade() picks, calls, reports, retries on other
nodes within the retry budget only; a reload that adds a node keeps the others' health; bad
input is named; /metrics and /v1/policies show each node."""

import pytest

from conftest import metric, wait_until
from sluice_client import (Refused, RetryBudget, outcome_for_exception, outcome_of_grpc,
                           outcome_of_http)

CONFIG = """
policies:
  replicas:
    kind: cascade
    nodes:
      a: {algorithm: fixed, limit: 4}
      b: {algorithm: fixed, limit: 4}
      c: {algorithm: fixed, limit: 4}
    breaker:
      failures: 3
      open_for: 30s
  plain:
    kind: cascade
    nodes:
      a: {algorithm: fixed, limit: 4}
      b: {algorithm: fixed, limit: 4}
      c: {algorithm: fixed, limit: 4}
"""


@pytest.fixture
def cascade_server(start_server):
    return start_server(CONFIG)


def nodes(client, policy="replicas"):
    return {n["name"]: n for n in client.policies()[policy].state["nodes"]}


def record(node):
    """A node's calls on record, summed over its stat buckets: a call lands in the bucket of its
    moment, so a bucket boundary passing during a test moves counts from the newest bucket to
    the next."""
    return {k: sum(b[k] for b in node["buckets"]) for k in ("finished", "succeeded")}


class Overloaded(Exception):
    status = 503


def test_outcomes_of_replies_and_exceptions():
    assert [outcome_of_http(s) for s in (200, 404, 429, 503, 504, 408, 500)] == [
        "success", "success", "overload", "overload", "timeout", "timeout", "failed"]
    assert [outcome_of_grpc(c) for c in (0, 3, 8, 14, 4, 1, 13)] == [
        "success", "success", "overload", "overload", "timeout", "ignored", "failed"]
    import grpc
    assert outcome_of_grpc(grpc.StatusCode.UNAVAILABLE) == "overload"
    assert outcome_for_exception(TimeoutError()) == "timeout"
    assert outcome_for_exception(Overloaded()) == "overload"
    assert outcome_for_exception(ValueError()) == "failed"
    assert outcome_for_exception(KeyboardInterrupt()) == "ignored"


def test_retry_budget_is_a_share_of_calls_plus_an_allowance():
    now = [100.0]
    b = RetryBudget(ratio=0.1, per_second=1, window=10, clock=lambda: now[0])
    assert sum(b.try_retry() for _ in range(50)) == 10  # the allowance alone
    for _ in range(100):
        b.record_call()
    assert sum(b.try_retry() for _ in range(50)) == 10  # + 10% of 100 calls
    now[0] += 10  # all of it ages out
    assert sum(b.try_retry() for _ in range(50)) == 10
    with pytest.raises(ValueError, match="ratio"):
        RetryBudget(ratio=2)


def test_admit_names_the_node_and_honours_exclude(cascade_server):
    client = cascade_server.client()
    lease = client.admit("replicas")
    assert lease.chosen in ("a", "b", "c")
    client.release(lease)
    for _ in range(10):
        other = client.admit("replicas", exclude=["a", "b"])
        assert other.chosen == "c"
        client.release(other, "success")
    with pytest.raises(TypeError, match="exclude"):
        client.admit("replicas", exclude="a")
    # Over HTTP, the same, and a bad list is named.
    # (b may have taken the first call above: its record is compared with what it was.)
    before = record(nodes(client)["b"])
    r = cascade_server.http("POST", "/v1/admit", {"policy": "replicas", "exclude": ["a", "c"]})
    assert r.status == 200 and r.json()["chosen"] == "b", r
    r2 = cascade_server.http("POST", "/v1/release",
                             {"lease_id": r.json()["lease_id"], "outcome": "overload"})
    assert r2.status == 200, r2
    assert record(nodes(client)["b"]) == {"finished": before["finished"] + 1,
                                          "succeeded": before["succeeded"]}
    bad = cascade_server.http("POST", "/v1/admit", {"policy": "replicas", "exclude": "a"})
    assert bad.status == 400 and "exclude: must be a list of strings" in bad.text, bad
    bad = cascade_server.http("POST", "/v1/release", {"lease_id": "0" * 32, "outcome": "meh"})
    assert bad.status == 400 and "timeout, overload" in bad.text, bad


def test_cascade_helper_reports_outcomes_and_a_failing_node_loses_its_traffic(cascade_server):
    client = cascade_server.client()

    def call(node):
        if node == "b":
            raise Overloaded()  # b sheds everything, fast
        return f"reply from {node}"

    served = {"a": 0, "c": 0}
    for _ in range(60):
        try:
            reply = client.cascade("replicas", call)
        except Overloaded:
            continue
        served[reply[-1]] += 1
    n = nodes(client)
    b_calls = record(n["b"])["finished"]
    # b's clean slate drew some calls; each failure is on record and its weight is now 0;
    # three in a row opened its breaker, so it got no more than three.
    assert 1 <= b_calls <= 3
    assert record(n["b"])["succeeded"] == 0
    assert n["b"]["weight"] == 0
    assert b_calls < 3 or n["b"]["breaker"]["state"] == "open"
    assert served["a"] + served["c"] == 60 - b_calls
    assert n["a"]["in_flight"] == n["b"]["in_flight"] == n["c"]["in_flight"] == 0
    m = cascade_server.metrics()
    assert metric(m, "sluice_cascade_node_weight", policy="replicas", node="b") == 0
    assert metric(m, "sluice_cascade_node_success_rate", policy="replicas", node="a") == 1
    assert metric(m, "sluice_cascade_node_calls", policy="replicas", node="b",
                  result="failure") == b_calls


def test_retries_go_to_other_nodes_within_the_budget(cascade_server):
    client = cascade_server.client()
    seen = []

    def fails(node):
        seen.append(node)
        return 500

    # (A policy without breakers: with them, the outage below would open every node's.)
    # One call, retried twice: three different nodes; the last reply is returned.
    assert client.cascade("plain", fails, classify=lambda s: outcome_of_http(s),
                          retries=2, budget=RetryBudget(ratio=0, per_second=1)) == 500
    assert len(seen) == 3 and len(set(seen)) == 3
    # An outage: with no allowance and 10% of calls, 50 failing calls make at most 5 retries.
    seen.clear()
    budget = RetryBudget(ratio=0.1, per_second=0)
    for _ in range(50):
        client.cascade("plain", fails, classify=outcome_of_http, retries=2, budget=budget)
    assert len(seen) == 55
    # A success is never retried; an exception that fails is re-raised after its retries.
    seen.clear()
    assert client.cascade("plain", lambda n: seen.append(n) or 200, classify=outcome_of_http,
                          retries=2) == 200
    assert len(seen) == 1
    with pytest.raises(ValueError, match="classify"):
        client.cascade("plain", lambda n: 200, classify=lambda r: "great")
    assert all(n["in_flight"] == 0 for n in nodes(client, "plain").values())


def test_every_node_full_is_refused_with_503(cascade_server):
    client = cascade_server.client()
    held = [client.admit("replicas") for _ in range(12)]
    with pytest.raises(Refused) as refused:
        client.admit("replicas")
    assert refused.value.status == 503
    assert "every node is at its concurrency limit (3 tried)" in refused.value.detail
    with pytest.raises(Refused):
        client.cascade("replicas", lambda n: pytest.fail("must not be called"))
    for lease in held:
        client.release(lease)


def test_a_reload_that_adds_a_node_keeps_the_others_health(cascade_server):
    client = cascade_server.client()
    for _ in range(6):
        client.cascade("replicas", lambda n: n)
    before = nodes(client)
    done = sum(record(n)["finished"] for n in before.values())
    assert done == 6
    cascade_server.write_config(CONFIG.replace("      c: {algorithm: fixed, limit: 4}\n",
                                               "      c: {algorithm: fixed, limit: 4}\n"
                                               "      d: {algorithm: fixed, limit: 4}\n"))
    cascade_server.signal(__import__("signal").SIGHUP)
    wait_until(lambda: "d" in nodes(client), 10, what="the reload")
    after = nodes(client)
    for name in "abc":
        assert record(after[name]) == record(before[name])
    assert after["d"]["basis"] == "clean_slate"
