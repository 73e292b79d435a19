"""The HTTP JSON mirror, metrics, health endpoints and the admin token."""

import re
import textwrap

import pytest

from conftest import metric, wait_until
from sluice_client import Refused

HEX32 = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_POLICIES = {"api-rate", "per-minute", "search", "small", "inventory", "gateway", "db",
                    "replicas"}


def test_check_200_then_429_with_retry_after(server, key):
    k = key()
    r = server.http("POST", "/v1/check", {"policy": "per-minute", "key": k, "hits": 1000})
    assert r.status == 200, r
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["allowed"] is True and body["remaining"] == 0 and body["limit"] == 1000
    # The draft's fields (server.rate_limit_headers: ietf, the default): the quota, then what
    # is left and the window's reset in whole seconds, rounded up (never early).
    assert r.headers["ratelimit-policy"] == '"per-minute";q=1000'
    m = re.fullmatch(r'"per-minute";r=0;t=(\d+)', r.headers["ratelimit"])
    assert m, r.headers["ratelimit"]
    reset = int(m.group(1))
    assert reset > 0
    assert reset * 1000 >= body["reset_after_ms"]
    assert reset * 1000 - body["reset_after_ms"] < 1000
    assert "x-ratelimit-limit" not in r.headers
    assert "retry-after" not in r.headers

    r = server.http("POST", "/v1/check", {"policy": "per-minute", "key": k})
    assert r.status == 429, r
    body = r.json()
    assert body["allowed"] is False
    # Until the window has slid far enough: under a second when the first check fell in the
    # window's last second, so only its sign is certain.
    assert body["retry_after_ms"] > 0
    assert int(r.headers["retry-after"]) >= 1
    assert int(r.headers["retry-after"]) * 1000 >= body["retry_after_ms"]  # rounded up
    assert r.headers["ratelimit"].startswith('"per-minute";r=0;t=')


@pytest.mark.parametrize("which", ["x-ratelimit", "both", "none"])
def test_rate_limit_headers_setting(start_server, key, which):
    server = start_server(textwrap.dedent(f"""\
        server:
          rate_limit_headers: {which}
        policies:
          "per \\"q\\"":
            kind: rate
            strategy: fixed-window
            limit: 2
            period: 1m
        """))
    k = key()
    r = server.http("POST", "/v1/check", {"policy": 'per "q"', "key": k})
    assert r.status == 200, r
    if which == "none":
        assert not {"ratelimit", "ratelimit-policy", "x-ratelimit-limit"} & set(r.headers)
    if which in ("x-ratelimit", "both"):
        assert r.headers["x-ratelimit-limit"] == "2"
        assert r.headers["x-ratelimit-remaining"] == "1"
        assert 0 < int(r.headers["x-ratelimit-reset"]) <= 60
    if which == "both":
        # A name is a structured-field string: its quotes are escaped.
        assert r.headers["ratelimit-policy"] == '"per \\"q\\"";q=2'
    if which == "x-ratelimit":
        assert "ratelimit-policy" not in r.headers
    server.http("POST", "/v1/check", {"policy": 'per "q"', "key": k})
    refused = server.http("POST", "/v1/check", {"policy": 'per "q"', "key": k})
    assert refused.status == 429
    assert 0 < int(refused.headers["retry-after"]) <= 60  # whatever the setting


def test_check_that_can_never_pass(server, key):
    r = server.http("POST", "/v1/check", {"policy": "api-rate", "key": key(), "hits": 21})
    assert r.status == 429
    assert r.json()["retry_after_ms"] is None
    assert "retry-after" not in r.headers  # there is no time to wait for


def test_peek_and_check_many(server, key):
    k, exhausted = key(), key()
    for _ in range(3):
        r = server.http("POST", "/v1/peek", {"policy": "per-minute", "key": k, "hits": 10})
        assert r.status == 200 and r.json()["remaining"] == 990
    assert server.http("POST", "/v1/check", {"policy": "per-minute", "key": exhausted,
                                             "hits": 1000}).status == 200
    r = server.http("POST", "/v1/check_many", {"checks": [
        {"policy": "per-minute", "key": k, "hits": 10},
        {"policy": "per-minute", "key": exhausted}]})
    assert r.status == 429, r
    body = r.json()
    assert body["allowed"] is False and body["denied_index"] == 1
    assert len(body["decisions"]) == 2
    r = server.http("POST", "/v1/peek", {"policy": "per-minute", "key": k})
    assert r.json()["remaining"] == 999  # refunded


def test_admit_release_heartbeat(server):
    r = server.http("POST", "/v1/admit", {"policy": "small", "ttl_ms": 5000})
    assert r.status == 200, r
    body = r.json()
    assert body["admitted"] is True and HEX32.match(body["lease_id"])
    assert body["ttl_ms"] == 5000
    lease_id = body["lease_id"]

    def small():
        ps = server.http("GET", "/v1/policies").json()["policies"]
        return next(p for p in ps if p["name"] == "small")

    assert small()["in_flight"] == 1

    r = server.http("POST", "/v1/heartbeat", {"lease_id": lease_id, "ttl_ms": 2000})
    assert r.status == 200 and r.json()["ttl_ms"] == 2000

    r = server.http("POST", "/v1/release", {"lease_id": lease_id, "outcome": "dropped",
                                            "rtt_ms": 12.5})
    assert r.status == 200, r
    assert r.json()["released"] is True and r.json()["held_ms"] >= 0
    state = small()
    assert state["in_flight"] == 0 and state["dropped"] == 1

    r = server.http("POST", "/v1/release", {"lease_id": lease_id})
    assert r.status == 404
    assert r.json()["error"]["message"].startswith("lease_id:")

    # A call that failed, not from overload: released, counted as ignored, never as dropped.
    lease_id = server.http("POST", "/v1/admit", {"policy": "small"}).json()["lease_id"]
    r = server.http("POST", "/v1/release", {"lease_id": lease_id, "outcome": "failed"})
    assert r.status == 200, r
    state = small()
    assert state["in_flight"] == 0 and state["dropped"] == 1 and state["ignored"] == 1


def test_a_kept_lease_over_http(server):
    """An adaptive policy's lease is reusable: a release with keep records the call (and the
    earlier ones it lists) and keeps the permit; the release without keep ends it."""
    def small():
        ps = server.http("GET", "/v1/policies").json()["policies"]
        return next(p for p in ps if p["name"] == "small")

    body = server.http("POST", "/v1/admit", {"policy": "small"}).json()
    assert body["reusable"] is True
    lease_id = body["lease_id"]
    r = server.http("POST", "/v1/release", {
        "lease_id": lease_id, "keep": True, "outcome": "success", "rtt_ms": 2,
        "earlier": [{"outcome": "dropped", "rtt_ms": 5}, {"rtt_ms": 1}]})
    assert r.status == 200, r
    assert r.json()["kept"] is True and r.json()["released"] is False
    state = small()
    assert state["in_flight"] == 1 and state["renewed"] == 3 and state["dropped"] == 1
    bad = [
        ({"keep": 1}, "keep: must be true or false"),
        ({"earlier": {}}, "earlier: must be a list"),
        ({"earlier": [3]}, "earlier[0]: must be an object"),
        ({"earlier": [{"rtt_ms": 1}, {"outcome": "dropped"}]}, "earlier[1].rtt_ms: required"),
        ({"earlier": [{"outcome": "slow", "rtt_ms": 1}]}, "earlier[0].outcome: must be success"),
        ({"earlier": [{"rtt_ms": 1, "rtt": 1}]}, "earlier[0].rtt: unknown field"),
        ({"earlier": [{"rtt_ms": 1}] * 1025}, "earlier: at most 1024 calls, not 1025"),
        ({"keep": True, "cost": 1}, "keep: not with a cost"),
    ]
    for fields, message in bad:
        r = server.http("POST", "/v1/release", {"lease_id": lease_id, **fields})
        assert r.status == 400, (fields, r)
        assert r.json()["error"]["message"].startswith(message), (fields, r)
    assert small()["renewed"] == 3  # a refused release records nothing
    r = server.http("POST", "/v1/release", {"lease_id": lease_id, "earlier": [{"rtt_ms": 1}]})
    assert r.status == 200 and r.json()["released"] is True and "kept" not in r.json()
    state = small()
    assert state["in_flight"] == 0 and state["renewed"] == 4 and state["released"] == 1
    # A lease that is not reusable (a concurrency policy's) is released by a keep, and says so.
    body = server.http("POST", "/v1/admit", {"policy": "gateway", "key": "kept", "tenant": "acme",
                                             "upstream": "llm"}).json()
    assert body["admitted"] is True and "reusable" not in body
    r = server.http("POST", "/v1/release", {"lease_id": body["lease_id"], "keep": True})
    assert r.status == 409, r
    assert r.json()["error"]["message"].startswith("keep: the lease is not reusable")
    r = server.http("POST", "/v1/release", {"lease_id": body["lease_id"]})
    assert r.status == 404  # released all the same


def test_admit_refusal_is_problem_json(server, client):
    leases = [client.admit("small") for _ in range(10)]
    try:
        r = server.http("POST", "/v1/admit", {"policy": "small"})
        assert r.status == 503, r
        assert r.headers["content-type"] == "application/problem+json"
        assert r.headers["retry-after"] == "1"
        assert r.headers["x-sluice-error-source"] == "concurrency"
        problem = r.json()
        assert problem["status"] == 503 and problem["policy"] == "small"
        assert problem["type"] == "urn:sluice:problem:concurrency-limit-exceeded"
        # One rendering: the gRPC reply carries the very document the HTTP mirror sends.
        with pytest.raises(Refused) as refused:
            client.admit("small")
        assert refused.value.problem == problem
    finally:
        for lease in leases:
            client.release(lease)


CHAINED_CONFIG = textwrap.dedent("""\
    policies:
      slow:
        kind: rate
        strategy: gcra
        limit: 1
        period: 1h
      guarded:
        kind: adaptive
        algorithm: fixed
        limit: 5
        rate: slow
    """)


def test_a_chained_rate_refusal_is_a_429_problem_from_the_rate_policy(start_server):
    # guarded passes slow (1 per hour per key) first: the second admit of a key is refused by
    # the rate, with the rate policy's problem, Retry-After and error source, and takes no permit.
    server = start_server(CHAINED_CONFIG)
    r = server.http("POST", "/v1/admit", {"policy": "guarded", "key": "k"})
    assert r.status == 200, r
    r = server.http("POST", "/v1/admit", {"policy": "guarded", "key": "k"})
    assert r.status == 429, r
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["x-sluice-error-source"] == "rate"
    assert int(r.headers["retry-after"]) > 3500
    problem = r.json()
    assert problem["policy"] == "slow" and problem["limit_type"] == "rate"
    assert problem["remaining"] == 0 and problem["retry_after_seconds"] > 3500
    ps = server.http("GET", "/v1/policies").json()["policies"]
    assert next(p for p in ps if p["name"] == "guarded")["in_flight"] == 1


def test_bad_input_is_400_naming_the_field(server):
    r = server.http("POST", "/v1/check", "{not json")
    assert r.status == 400
    err = r.json()["error"]
    assert err["code"] == "invalid_argument"
    assert "JSON" in err["message"]
    # A key twice in one object (at any depth) is refused, naming it, and takes nothing.
    # (the last "hits" is 1: a parser that kept it would take one)
    for body, name in [('{"policy": "api-rate", "key": "twice", "hits": 1000, "hits": 1}', "hits"),
                       ('{"checks": [{"policy": "api-rate", "key": "a", "key": "b"}]}', "key"),
                       ('{"policy": "api-rate", "key": "k", "": 1, "": 2}', "")]:
        path = "/v1/check" if "checks" not in body else "/v1/check_many"
        r = server.http("POST", path, body)
        assert r.status == 400, (body, r)
        assert r.json()["error"]["message"] == f'body: the key "{name}" appears twice in one object'
    r = server.http("POST", "/v1/peek", {"policy": "api-rate", "key": "twice"})
    assert r.status == 200 and r.json()["remaining"] == r.json()["limit"] - 1, r  # a fresh key

    cases = [
        ("/v1/check", {"policy": "api-rate", "key": "k", "hits": "many"}, "hits:"),
        ("/v1/check", {"policy": "api-rate", "key": "k", "hits": 0}, "hits:"),
        ("/v1/check", {"policy": "api-rate", "key": ""}, "key:"),
        ("/v1/check", [1, 2], "body:"),
        ("/v1/check_many", {"checks": {}}, "checks:"),
        ("/v1/admit", {"policy": "small", "ttl_ms": -5}, "ttl_ms:"),
        ("/v1/release", {"lease_id": "0" * 32, "outcome": "crashed"}, "outcome:"),
        ("/v1/release", {"lease_id": "xyz"}, "lease_id:"),
        # beyond 64-bit signed: refused, never wrapped to a negative count
        ("/v1/check", {"policy": "api-rate", "key": "k", "hits": 2**63},
         "hits: must be at most 9223372036854775807"),
        ("/v1/check", {"policy": "api-rate", "key": "k", "hits": 2**64 - 1}, "hits: must be at most"),
        # unknown fields are errors naming them (a misspelt ttl must not become the default)
        ("/v1/admit", {"policy": "small", "ttl": 5000},
         "ttl: unknown field (known: policy, key, tenant, upstream, route, ttl_ms, exclude, "
         "max_wait_ms, attributes)"),
        ("/v1/admit", {"policy": "small", "max_wait_ms": -1}, "max_wait_ms:"),
        ("/v1/admit", {"policy": "small", "attributes": ["tenant"]}, "attributes: must be an object"),
        ("/v1/admit", {"policy": "small", "attributes": {"tenant": 3}}, "attributes: values must"),
        ("/v1/admit", {"policy": "small", "attributes": {"": "x"}}, "attributes: '' is not"),
        ("/v1/admit", {"policy": "gateway", "attributes": {"tenant": ["a", "b"]}}, "tenant: takes one"),
        ("/v1/check", {"policy": "api-rate", "key": "k", "hit": 2}, "hit: unknown field"),
        ("/v1/check_many", {"checks": [{"policy": "api-rate", "key": "k", "hitz": 1}]},
         "checks[0].hitz: unknown field"),
        ("/v1/check_many", {"checks": [], "all": True}, "all: unknown field (known: checks)"),
        ("/v1/release", {"lease_id": "0" * 32, "rtt": 5}, "rtt: unknown field"),
        ("/v1/heartbeat", {"lease_id": "0" * 32, "ttl": 5}, "ttl: unknown field"),
        # a zero TTL is refused naming the field the call sent (not the engine's "ttl")
        ("/v1/admit", {"policy": "small", "ttl_ms": 0}, "ttl_ms: must be more than 0"),
        ("/v1/heartbeat", {"lease_id": "0" * 32, "ttl_ms": 0}, "ttl_ms: must be more than 0"),
        ("/v1/admit", {"policy": "small", "ttl_ms": 10 ** 9},
         "ttl: must be at most the server's max_lease_ttl (10m)"),
    ]
    for path, body, field in cases:
        r = server.http("POST", path, body)
        assert r.status == 400, (path, body, r)
        assert r.json()["error"]["message"].startswith(field), (path, body, r)

    r = server.http("POST", "/v1/check", {"policy": "nope", "key": "k"})
    assert r.status == 404 and r.json()["error"]["message"].startswith("policy:")
    r = server.http("POST", "/v1/check", {"policy": "small", "key": "k"})
    assert r.status == 409
    r = server.http("GET", "/v1/check")
    assert r.status == 405 and r.headers["allow"] == "POST"
    assert server.http("GET", "/no/such/endpoint").status == 404


def test_metrics(server, client, key):
    assert client.check("api-rate", key()).allowed
    assert not client.check("api-rate", key(), hits=21).allowed
    with client.lease("small"):
        samples = server.metrics()
    assert metric(samples, "sluice_rate_decisions_total", policy="api-rate",
                  decision="allowed") == 1
    assert metric(samples, "sluice_rate_decisions_total", policy="api-rate",
                  decision="denied") == 1
    assert metric(samples, "sluice_rate_decisions_total", policy="per-minute",
                  decision="allowed") == 0
    assert metric(samples, "sluice_fleet_l_global", policy="inventory") > 0
    assert metric(samples, "sluice_fleet_share", policy="inventory") > 0
    assert metric(samples, "sluice_leases") == 1
    assert metric(samples, "sluice_policy_in_flight", policy="small") == 1
    assert metric(samples, "sluice_config_generation") == 1
    assert metric(samples, "sluice_draining") == 0
    text = server.http("GET", "/metrics").text
    assert "# TYPE sluice_rate_decisions_total counter" in text


def test_health_ready_and_policies(server):
    r = server.http("GET", "/healthz")
    assert r.status == 200 and r.text == "ok\n"
    # Ready once the fleet policy's guard reached its (embedded) coordinator.
    r = wait_until(lambda: (lambda r: r if r.status == 200 else None)(
        server.http("GET", "/readyz")), timeout=5, what="/readyz 200")
    assert r.text == "ready\n"

    r = server.http("GET", "/v1/policies")
    assert r.status == 200
    body = r.json()
    assert {p["name"] for p in body["policies"]} == DEFAULT_POLICIES
    assert body["generation"] == 1 and body["draining"] is False and body["leases"] == 0
    kinds = {p["name"]: p["kind"] for p in body["policies"]}
    assert kinds == {"api-rate": "rate", "per-minute": "rate", "search": "adaptive",
                     "small": "adaptive", "inventory": "fleet", "gateway": "concurrency",
                     "db": "throttler", "replicas": "cascade"}


def test_grpc_policies_match_http(client):
    ps = client.policies()
    assert set(ps) == DEFAULT_POLICIES
    assert ps["gateway"].rate == "api-rate" and ps["search"].rate == "api-rate"
    assert ps["small"].limit == 10
    assert ps["api-rate"].limit == 100  # hits per period
    assert ps["inventory"].state["phase"] == "active"
    assert ps.config_generation == 1 and ps.leases == 0


ADMIN_CONFIG = textwrap.dedent("""\
    server:
      admin_token: "s3cret-token"
    policies:
      r:
        kind: rate
        limit: 5
""")


def test_admin_reload_needs_the_token(start_server):
    server = start_server(ADMIN_CONFIG)
    for headers in ({}, {"Authorization": "Bearer wrong-token!"},
                    {"Authorization": "s3cret-token"}, {"Authorization": "Basic s3cret-token"}):
        r = server.http("POST", "/admin/reload", headers=headers)
        assert r.status == 401, (headers, r)
        assert r.headers.get("www-authenticate") == "Bearer"
        assert r.json()["error"]["message"].startswith("authorization:")
    assert server.client().policies().config_generation == 1  # nothing reloaded

    r = server.http("POST", "/admin/reload", headers={"Authorization": "Bearer s3cret-token"})
    assert r.status == 200, r
    body = r.json()
    assert body["reloaded"] is True and body["generation"] == 2
    assert "kept r" in body["message"]
    assert server.client().policies().config_generation == 2
    assert server.http("GET", "/admin/reload").status == 405


def test_admin_reload_without_token_configured(start_server):
    server = start_server(ADMIN_CONFIG.replace('  admin_token: "s3cret-token"\n', "  lease_ttl: 5s\n"))
    r = server.http("POST", "/admin/reload")
    assert r.status == 200 and r.json()["reloaded"] is True


def test_check_many_entry_that_is_not_an_object(server):
    r = server.http("POST", "/v1/check_many", {"checks": [5]})
    assert r.status == 400
    assert r.json()["error"]["message"] == "checks[0]: must be an object"


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/v1/policies"])
def test_get_endpoints_refuse_post(server, path):
    r = server.http("POST", path, "{}")
    assert r.status == 405
