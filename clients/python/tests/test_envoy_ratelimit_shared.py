"""Envoy's rate limit service shared by three `sluice serve` processes (three regions) through a
real Redis: each limit is one budget for all of them, decided from escrow (far fewer Redis
calls than requests), never more than its limit; a rule marked `sluice_shared: false` is
each server's own; and when Redis is gone, a request that needs a lease is answered within the
policy's lease_timeout as its `outage` says (UNAVAILABLE for Envoy's failure mode, or
OVER_LIMIT).

A fresh Redis counts the window of its first lease as spent (coordinator_restarted: it cannot
tell new from restarted empty, sluice/backends/redis_rate_coordinator.h), so the shared limit
here is per second and the measured requests run in a later second."""

import textwrap
import time

import grpc
import pytest

from conftest import free_port

rls_pb2 = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
rls_pb2_grpc = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2_grpc")

OK, OVER_LIMIT = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
REGIONS = ("eu-west", "us-east", "ap-south")
LIMIT = 30

RULES = textwrap.dedent(f"""\
    domain: edge
    descriptors:
      - key: user
        rate_limit:
          unit: second
          requests_per_unit: {LIMIT}
      - key: tenant
        sluice_shared: false
        rate_limit:
          unit: hour
          requests_per_unit: 5
    """)


def serve_region(start_server, tmp_path, redis, region, outage="error", server_section=""):
    rules = tmp_path / f"rules-{region}.yaml"
    rules.write_text(RULES)
    server = start_server(server_section + textwrap.dedent(f"""\
        coordinators:
          global:
            kind: redis
            address: 127.0.0.1:{redis.port}
        policies:
          edge:
            kind: envoy_ratelimit
            config: {rules}
            coordinator: global
            region: {region}
            batch: 4
            lease_timeout: 300ms
            outage: {outage}
        """))
    channel = grpc.insecure_channel(server.grpc_target)
    return server, channel, rls_pb2_grpc.RateLimitServiceStub(channel)


def request(key, value):
    req = rls_pb2.RateLimitRequest(domain="edge")
    req.descriptors.add().entries.add(key=key, value=value)
    return req


def next_second(margin: float = 0.02) -> int:
    """Sleeps until just after the next second starts; that second."""
    now = time.time()
    time.sleep(int(now) + 1 + margin - now)
    return int(time.time())


def test_three_regions_share_each_limit_through_redis(start_server, tmp_path, redis):
    nodes = [serve_region(start_server, tmp_path, redis, r) for r in REGIONS]
    try:
        # The first lease marks the fresh Redis: its second counts as spent (the others' first
        # requests may fall in the next second already).
        first = nodes[0][2].ShouldRateLimit(request("user", "first"), timeout=5)
        assert first.overall_code == OVER_LIMIT, first
        refused = nodes[0][0].client().policies().by_name["edge"].state["shared_refusals"]
        assert refused == {"coordinator_restarted": 1}, refused
        for attempt in range(3):  # again if the run did not fit in one second
            user = f"u{attempt}"
            start = next_second()
            before = redis.script_calls()
            answers = [nodes[i % 3][2].ShouldRateLimit(request("user", user), timeout=5)
                       for i in range(3 * LIMIT)]
            calls = redis.script_calls() - before
            if int(time.time()) == start:
                break
        else:
            pytest.fail("90 requests never fit in one second")
        admitted = [sum(a.overall_code == OK for a in answers[i::3]) for i in range(3)]
        # One budget for the three: its limit exactly (each alone would admit 30 of its 30).
        assert sum(admitted) == LIMIT, admitted
        assert all(n > 0 for n in admitted), admitted
        assert all(a.statuses[0].current_limit.requests_per_unit == LIMIT for a in answers)
        # Escrow: the requests cost far fewer calls to Redis than one each.
        assert 0 < calls * 3 <= len(answers), (calls, len(answers))
        print(f"\n[rls shared] {len(answers)} requests over 3 regions in one second: admitted "
              f"{admitted} (limit {LIMIT}); Redis script calls {calls}")

        # sluice_shared: false: the tenant limit is each server's own (5 each).
        tenant = [n[2].ShouldRateLimit(request("tenant", "t"), timeout=5).overall_code == OK
                  for n in nodes for _ in range(7)]
        assert sum(tenant) == 15, tenant

        state = nodes[0][0].client().policies().by_name["edge"].state
        assert state["coordinator"] == "redis" and state["region"] == "eu-west", state
        assert state["shared_limits"] == 1 and state["leases"] > 0, state
    finally:
        for _, channel, _ in nodes:
            channel.close()


def test_redis_gone_answers_within_the_lease_timeout_as_outage_says(start_server, tmp_path,
                                                                       redis):
    error_node = serve_region(start_server, tmp_path, redis, "eu-west", outage="error")
    closed_node = serve_region(start_server, tmp_path, redis, "us-east", outage="over-limit")
    try:
        for _, _, stub in (error_node, closed_node):  # each leases once: Redis is there
            stub.ShouldRateLimit(request("user", "warm"), timeout=5)
        redis.kill()
        # A new key needs a lease: no answer from Redis, so the outage mode answers, in time.
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            error_node[2].ShouldRateLimit(request("user", "new"), timeout=5)
        took = time.monotonic() - t0
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
        assert "cannot be reached" in e.value.details() and "outage: error" in e.value.details()
        assert took < 0.3 + 1.0, took
        t0 = time.monotonic()
        a = closed_node[2].ShouldRateLimit(request("user", "new"), timeout=5)
        assert a.overall_code == OVER_LIMIT, a
        assert time.monotonic() - t0 < 0.3 + 1.0
        # The per-server limit does not need Redis at all.
        assert error_node[2].ShouldRateLimit(request("tenant", "t"), timeout=5).overall_code == OK
        unavailable = error_node[0].client().policies().by_name["edge"].state["unavailable"]
        assert unavailable == 1, unavailable
    finally:
        for _, channel, _ in (error_node, closed_node):
            channel.close()


def test_a_request_that_waits_for_a_lease_over_json_and_the_envoy_port(start_server, tmp_path,
                                                                         redis):
    """A key's first request waits for its lease: answered later through HTTP (POST /json) and
    through server.envoy_grpc as through the gRPC port."""
    port = free_port()
    server, channel, stub = serve_region(start_server, tmp_path, redis, "eu-west",
                                         server_section=f"server:\n  envoy_grpc: 127.0.0.1:{port}\n")
    try:
        stub.ShouldRateLimit(request("user", "first"), timeout=5)  # the fresh Redis's second
        next_second()
        body = {"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "j"}]}]}
        r = server.http("POST", "/json", body)
        assert r.status == 200, r
        assert r.json()["statuses"][0]["currentLimit"] == {"requestsPerUnit": LIMIT,
                                                          "unit": "SECOND"}
        with grpc.insecure_channel(f"127.0.0.1:{port}") as envoy_channel:
            envoy = rls_pb2_grpc.RateLimitServiceStub(envoy_channel)
            assert envoy.ShouldRateLimit(request("user", "e"), timeout=5).overall_code == OK
        state = server.client().policies().by_name["edge"].state
        assert state["leases"] >= 3, state  # the first key's, then each new key's own
    finally:
        channel.close()
