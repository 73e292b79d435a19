"""Concurrency policies over gRPC: Admit, Release, Heartbeat, the lease context manager, policy
chaining, and lease expiry when a client dies."""

import contextlib
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sluice_client
from conftest import metric, wait_until
from sluice_client import NotFound, Refused

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def in_flight(client, policy):
    return client.policies()[policy].in_flight


def test_lease_context_manager_admits_and_releases(client):
    before = client.policies()["small"].state
    with client.lease("small", ttl=5) as lease:
        assert HEX32.match(lease.lease_id)
        assert lease.ttl == 5.0 and lease.policy == "small"
        assert lease.chosen == ""  # a concurrency policy chooses no node
        ps = client.policies()
        assert ps["small"].in_flight == 1 and ps.leases == 1
    assert lease.released
    ps = client.policies()
    assert ps["small"].in_flight == 0 and ps.leases == 0
    assert ps["small"].state["released"] == before["released"] + 1
    with pytest.raises(NotFound):  # it really was released
        client.release(lease)


def test_a_failed_call_is_released_as_failed(client):
    before = client.policies()["small"].state
    lease = client.admit("small")
    client.release(lease, "failed", rtt=0.01)
    after = client.policies()["small"].state
    assert after["in_flight"] == 0 and after["released"] == before["released"] + 1
    assert after["ignored"] == before["ignored"] + 1 and after["dropped"] == before["dropped"]


def test_a_reusable_lease_is_kept_for_the_next_call(client):
    """An adaptive policy's lease is reusable: keep() records the call (and the earlier ones)
    and keeps the permit; a lease that is not reusable is released by it, with the error."""
    before = client.policies()["small"].state
    lease = client.admit("small")
    assert lease.reusable
    assert client.keep(lease, "success", rtt=0.002, earlier=[("dropped", 0.005)]) is True
    state = client.policies()["small"].state
    assert state["in_flight"] == before["in_flight"] + 1
    assert state["renewed"] == before["renewed"] + 2
    assert state["dropped"] == before["dropped"] + 1
    with pytest.raises(ValueError, match="^outcome: must be one of"):
        client.keep(lease, "slow")
    with pytest.raises(ValueError, match=r"^earlier\[1\]\.outcome: must be one of"):
        client.keep(lease, earlier=[("success", 0.001), ("slow", 0.001)])
    client.release(lease)
    assert client.policies()["small"].state["in_flight"] == before["in_flight"]
    gateway = client.admit("gateway", key="kept", tenant="acme", upstream="llm")
    assert not gateway.reusable
    with pytest.raises(sluice_client.FailedPrecondition, match="keep: the lease is not reusable"):
        client.keep(gateway)
    with pytest.raises(NotFound):
        client.release(gateway)  # released all the same


def test_fixed_limit_refuses_the_eleventh_with_503(client):
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(client.lease("small")) for _ in range(9)]
        with client.lease("small") as tenth:
            held.append(tenth)
            assert in_flight(client, "small") == 10
            with pytest.raises(Refused) as refused:
                client.admit("small")
            r = refused.value
            assert r.status == 503
            assert r.policy == "small" and r.level == "limit"
            assert (r.current, r.limit) == (10, 10)
            assert r.retry_after == 1.0
            assert r.problem["status"] == 503
            assert r.problem["max_concurrent"] == 10
            assert r.problem["type"] == r.type == "urn:sluice:problem:concurrency-limit-exceeded"
            assert in_flight(client, "small") == 10  # a refusal takes nothing
        assert tenth.released
        assert in_flight(client, "small") == 9
        with client.lease("small") as again:  # one slot free again
            assert in_flight(client, "small") == 10
        assert again.released
        assert len({lease.lease_id for lease in held}) == 10
    assert in_flight(client, "small") == 0
    assert client.policies()["small"].state["refused_by_limit"] == 1


def test_block_exception_outcomes(client):
    def dropped():
        return client.policies()["small"].state["dropped"]

    with pytest.raises(TimeoutError):
        with client.lease("small"):
            raise TimeoutError("the backend did not answer")
    assert dropped() == 1 and in_flight(client, "small") == 0

    with pytest.raises(ValueError):
        with client.lease("small"):
            raise ValueError("a client-side bug")
    assert dropped() == 1 and in_flight(client, "small") == 0  # ignored, not dropped

    with client.lease("small") as lease:
        lease.outcome = "dropped"  # the block decides
    assert dropped() == 2


def test_a_bad_outcome_set_in_the_block_still_frees_the_slot(client):
    with pytest.raises(ValueError) as info:
        with client.lease("small") as lease:
            lease.outcome = "sucess"  # a typo
    assert "lease.outcome" in str(info.value) and "'sucess'" in str(info.value)
    assert lease.released and in_flight(client, "small") == 0

    with pytest.raises(KeyError):  # the block's own error wins; the slot is freed all the same
        with client.lease("small") as lease:
            lease.outcome = "sucess"
            raise KeyError("the block failed")
    assert lease.released and in_flight(client, "small") == 0


def test_lease_context_manager_reports_outcome_and_rtt(client, monkeypatch):
    calls = []
    real_release = client.release

    def spy(lease, outcome="success", rtt=None):
        calls.append((outcome, rtt))
        return real_release(lease, outcome, rtt)

    monkeypatch.setattr(client, "release", spy)

    with client.lease("small"):
        time.sleep(0.05)
    outcome, rtt = calls.pop()
    assert outcome == "success" and 0.05 <= rtt < 1.0

    for exc, expected in ((TimeoutError(), "dropped"), (sluice_client.DeadlineExceeded("x"),
                                                         "dropped"),
                          (ValueError(), "ignored"), (KeyboardInterrupt(), "ignored")):
        with pytest.raises(type(exc)):
            with client.lease("small"):
                raise exc
        assert calls.pop()[0] == expected

    with client.lease("small") as lease:  # released inside: not released again
        client.release(lease, "ignored")
    assert [c[0] for c in calls] == ["ignored"]
    calls.clear()

    with pytest.raises(ValueError):  # the block's error wins over a failing release
        with client.lease("small", ttl=0.2) as lease:
            time.sleep(0.4)  # expires on the server meanwhile
            raise ValueError("boom")
    assert calls.pop()[0] == "ignored"

    with pytest.raises(NotFound):  # a clean block whose lease expired: the release fails loudly
        with client.lease("small", ttl=0.2):
            time.sleep(0.4)

    with contextlib.ExitStack() as stack:
        for _ in range(10):
            stack.enter_context(client.lease("small"))
        calls.clear()
        with pytest.raises(Refused):
            with client.lease("small"):
                pytest.fail("a refused lease must not run the block")
        assert calls == []  # nothing to release


def test_chained_rate_refuses_with_429_and_takes_no_permit(client):
    tenant = "acme-team"  # gateway chains api-rate, keyed by the tenant when no key is given
    first = client.admit("gateway", tenant=tenant, upstream="llm")
    held = [first]
    assert in_flight(client, "gateway") == 1
    # Exhaust the tenant's rate, then admit at once. api-rate gives a hit back every 10 ms, so a
    # slow machine may win one back in between: then hold that lease too and go again.
    refusal = None
    for _ in range(20):
        while client.check("api-rate", tenant).allowed:
            pass
        try:
            held.append(client.admit("gateway", tenant=tenant, upstream="llm"))
        except Refused as r:
            refusal = r
            break
    assert refusal is not None, "gateway never refused once api-rate was exhausted"
    assert refusal.status == 429
    assert refusal.policy == "api-rate" and refusal.level == "rate"
    assert refusal.retry_after is not None and 0 < refusal.retry_after <= 0.011
    assert refusal.problem["status"] == 429
    assert refusal.problem["type"] == "urn:sluice:problem:rate-limit-exceeded"
    state = client.policies()["gateway"]
    assert state.in_flight == len(held)  # the refused call took no permit
    assert state.state["refused_by_rate"] == 1
    assert state.state["refused_by_limit"] == 0
    for lease in held:
        client.release(lease)
    assert in_flight(client, "gateway") == 0


def test_gateway_limits_refuse_with_503(client, key):
    # route chat allows 20 at once; each admit names its own key, so api-rate does not interfere.
    with contextlib.ExitStack() as stack:
        for _ in range(20):
            stack.enter_context(client.lease("gateway", key=key(), tenant="acme-team",
                                             upstream="llm", route="chat"))
        with pytest.raises(Refused) as refused:
            client.admit("gateway", key=key(), tenant="acme-team", upstream="llm", route="chat")
        assert refused.value.status == 503
        assert refused.value.level == "route"
        assert in_flight(client, "gateway") == 20
        # The same call with its names given as attributes: the same route, the same refusal.
        with pytest.raises(Refused) as refused:
            client.admit("gateway", key=key(), attributes={"tenant": "acme-team",
                                                           "upstream": "llm", "route": "chat"})
        assert refused.value.level == "route"
        # Without the route, the upstream still has room.
        with client.lease("gateway", key=key(), tenant="acme-team", upstream="llm"):
            assert in_flight(client, "gateway") == 21
    assert in_flight(client, "gateway") == 0


def test_lease_ids_are_random_and_unguessable(client):
    ids = []
    for _ in range(1000):
        lease = client.admit("small")
        ids.append(lease.lease_id)
        client.release(lease)
    assert all(HEX32.match(i) for i in ids)
    assert len(set(ids)) == 1000
    # Random 128-bit ids differ from the previous one in ~64 bits; a counter or a clock in ~1-10.
    bits = [bin(int(a, 16) ^ int(b, 16)).count("1") for a, b in zip(ids, ids[1:])]
    assert 56 <= sum(bits) / len(bits) <= 72
    # Every hex digit position takes many values.
    assert min(len({i[p] for i in ids}) for p in range(32)) >= 12

    # A neighbour of a live lease's id is no lease at all, and does not touch the real one.
    lease = client.admit("small")
    last = lease.lease_id[-1]
    neighbour = lease.lease_id[:-1] + ("0" if last != "0" else "1")
    other = sluice_client.Client(client.target)
    try:
        with pytest.raises(NotFound):
            other.release(neighbour)
        with pytest.raises(NotFound):
            other.heartbeat(neighbour)
    finally:
        other.close()
    client.release(lease)


def test_heartbeat_keeps_a_lease_alive_past_its_ttl(client):
    kept = client.admit("small", ttl=1.0)
    control = client.admit("small", ttl=1.0)  # never heartbeats
    start = time.monotonic()
    while time.monotonic() - start < 2.0:
        assert client.heartbeat(kept) == 1.0  # unset: the lease's current TTL
        time.sleep(0.3)
    assert client.heartbeat(kept, ttl=2.5) == 2.5
    assert kept.ttl == 2.5
    assert client.release(kept) >= 2.0  # held since admission
    with pytest.raises(NotFound):  # the control lease expired after its 1 s
        client.release(control)
    assert in_flight(client, "small") == 0


LEASE_TTL_CONFIG = """\
server:
  lease_ttl: 1s
policies:
  one:
    kind: adaptive
    algorithm: fixed
    limit: 1
"""

CHILD = textwrap.dedent("""\
    import sys, time
    from sluice_client import Client
    lease = Client(sys.argv[1]).admit("one")
    print(lease.lease_id, lease.ttl, flush=True)
    time.sleep(60)
""")


def _child_env():
    import os

    import sluice.v1.sluice_pb2 as pb2

    stubs = Path(pb2.__file__).resolve().parents[2]
    package = Path(sluice_client.__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(stubs), str(package)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def test_lease_expires_when_its_client_dies(start_server):
    server = start_server(LEASE_TTL_CONFIG)
    client = server.client()
    child = subprocess.Popen([sys.executable, "-c", CHILD, server.grpc_target],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_child_env())
    try:
        ready, _, _ = select.select([child.stdout], [], [], 15)
        line = child.stdout.readline() if ready else ""
        if not line:
            child.kill()
            pytest.fail(f"the child printed no lease id; its stderr:\n{child.stderr.read()}")
        lease_id, ttl = line.split()
        assert HEX32.match(lease_id) and float(ttl) == 1.0
        child.send_signal(signal.SIGKILL)
        child.wait(5)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    killed_at = time.monotonic()

    # The dead client's lease still holds the only slot...
    with pytest.raises(Refused) as refused:
        client.admit("one")
    assert refused.value.status == 503
    assert in_flight(client, "one") == 1

    # ...until its TTL passes without a heartbeat.
    def admitted():
        try:
            return client.admit("one")
        except Refused:
            return None

    lease = wait_until(admitted, timeout=5.0, interval=0.05, what="the dead client's lease to "
                                                                  "expire")
    assert time.monotonic() - killed_at < 5.0
    client.release(lease)
    with pytest.raises(NotFound):
        client.release(lease_id)
    assert metric(server.metrics(), "sluice_leases_expired_total") >= 1
    assert "expired 1 lease(s)" in server.log()


def test_concurrent_admits_never_exceed_the_limit(server):
    import concurrent.futures

    clients = [server.client() for _ in range(4)]

    def try_admit(i):
        try:
            return clients[i % 4].admit("small", ttl=10)
        except Refused as r:
            assert r.status == 503
            return None

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(try_admit, range(200)))
    admitted = [lease for lease in results if lease is not None]
    assert len(admitted) == 10
    ps = clients[0].policies()
    assert ps["small"].in_flight == 10 and ps.leases == 10
    assert ps["small"].state["refused_by_limit"] == 190
    for lease in admitted:
        clients[1].release(lease)
    assert in_flight(clients[0], "small") == 0


@pytest.mark.parametrize("policy, kwargs", [
    ("search", {"key": "user-1"}),  # adaptive (gradient2), chained with api-rate
    ("inventory", {}),  # fleet, embedded memory coordinator
    ("gateway", {"tenant": "acme", "upstream": "llm"}),  # concurrency
])
def test_every_concurrency_kind_admits_and_releases(client, policy, kwargs):
    with client.lease(policy, **kwargs) as lease:
        assert HEX32.match(lease.lease_id)
        assert in_flight(client, policy) == 1
    assert in_flight(client, policy) == 0
    assert client.policies()[policy].state["released"] == 1


def test_a_fleet_admit_carries_the_call_deadline_to_pass_on(server, client):
    """A fleet's bound holds only when no call outlives its deadline: the admission says it."""
    deadline_s = client.policies()["inventory"].state["call_deadline_ms"] / 1000
    assert deadline_s > 0
    lease = client.admit("inventory")
    assert lease.deadline is not None
    assert 0 < lease.time_left() <= deadline_s
    assert lease.deadline <= lease.admitted_at + deadline_s
    client.release(lease)
    r = server.http("POST", "/v1/admit", {"policy": "inventory"})
    assert r.status == 200, r
    assert 0 < r.json()["call_deadline_ms"] <= deadline_s * 1000
    server.http("POST", "/v1/release", {"lease_id": r.json()["lease_id"]})
    # A policy without one says nothing.
    other = client.admit("small")
    assert other.deadline is None and other.time_left() is None
    client.release(other)
    assert "call_deadline_ms" not in server.http("POST", "/v1/admit", {"policy": "small"}).json()
