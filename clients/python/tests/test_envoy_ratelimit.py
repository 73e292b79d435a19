"""Envoy's rate limit service (the envoy_ratelimit kind) on a real `sluice serve`: what Envoy's
rate limit filter sends, over gRPC with its deadline, against a config taken unchanged from
envoyproxy/ratelimit's README; its HTTP form (POST /json); health and reflection; SIGHUP
keeping counters; `sluice validate` on a broken rule file."""

import json
import signal
import subprocess
import textwrap

import grpc
import pytest

from conftest import metric, sluice_bin, wait_until

rls_pb2 = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
rls_pb2_grpc = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2_grpc")

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
OK, OVER_LIMIT = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT

# envoyproxy/ratelimit's README, example 2, as it is there.
MESSAGING = textwrap.dedent("""\
    domain: messaging
    descriptors:
      # Only allow 5 marketing messages a day
      - key: message_type
        value: marketing
        descriptors:
          - key: to_number
            rate_limit:
              unit: day
              requests_per_unit: 5

      # Only allow 100 messages a day to any unique phone number
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 100
""")


def config_for(rules_path) -> str:
    return textwrap.dedent(f"""\
        policies:
          edge:
            kind: envoy_ratelimit
            config: {rules_path}
        """)


@pytest.fixture
def rls(start_server, tmp_path):
    rules = tmp_path / "ratelimit" / "config"
    rules.mkdir(parents=True)
    (rules / "messaging.yaml").write_text(MESSAGING)
    server = start_server(config_for(rules))
    channel = grpc.insecure_channel(server.grpc_target)
    yield server, rls_pb2_grpc.RateLimitServiceStub(channel), rules
    channel.close()


def envoy_request(*descriptors, hits_addend=0, domain="messaging"):
    """A RateLimitRequest as Envoy's HTTP filter builds it: one descriptor per rate limit action
    list of the route (here: a request_headers action for the message type, another for the
    number), entries in the actions' order, hits_addend unset unless filter state sets it."""
    req = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits_addend)
    for entries in descriptors:
        d = req.descriptors.add()
        for key, value in entries:
            d.entries.add(key=key, value=value)
    return req


# Envoy's `rate_limit_service` timeout (its filter's default is 20 ms; deployments commonly set
# 0.25 s, as here, so a loaded test machine does not fail the call).
ENVOY_TIMEOUT = 0.25


def test_should_rate_limit_as_envoy_calls_it(rls):
    server, stub, _ = rls
    marketing = [("message_type", "marketing"), ("to_number", "2061111111")]
    number = [("to_number", "2061111111")]
    answers = [stub.ShouldRateLimit(envoy_request(marketing, number), timeout=ENVOY_TIMEOUT)
               for _ in range(6)]
    assert [a.overall_code for a in answers] == [OK] * 5 + [OVER_LIMIT]
    first, last = answers[0], answers[-1]
    assert first.statuses[0].current_limit.requests_per_unit == 5
    assert first.statuses[0].current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.DAY
    assert first.statuses[0].limit_remaining == 4
    assert 0 < first.statuses[0].duration_until_reset.seconds <= 86400
    assert first.statuses[1].current_limit.requests_per_unit == 100
    assert [s.code for s in last.statuses] == [OVER_LIMIT, OK]
    # The refused request added nothing to the number's 100.
    assert last.statuses[1].limit_remaining == 95
    m = server.metrics()
    assert metric(m, "sluice_rls_requests_total", policy="edge", code="over_limit") == 1
    assert metric(m, "sluice_rls_requests_total", policy="edge", code="ok") == 5
    assert metric(m, "sluice_rls_hits_total", policy="edge",
                  rule="messaging.message_type_marketing.to_number", result="over_limit") == 1


def test_bad_requests_are_errors_envoy_sees_as_errors(rls):
    _, stub, _ = rls
    with pytest.raises(grpc.RpcError) as info:
        stub.ShouldRateLimit(envoy_request([("to_number", "1")], domain=""), timeout=ENVOY_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "domain: must not be empty"
    with pytest.raises(grpc.RpcError) as info:
        stub.ShouldRateLimit(envoy_request(), timeout=ENVOY_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_no_envoy_ratelimit_policy_is_not_found(server):
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ShouldRateLimit(envoy_request([("to_number", "1")]), timeout=ENVOY_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "envoy_ratelimit" in info.value.details()


def test_json_endpoint(rls):
    server, _, _ = rls
    body = {"domain": "messaging",
            "descriptors": [{"entries": [{"key": "message_type", "value": "marketing"},
                                         {"key": "to_number", "value": "2069999999"}]}]}
    statuses = [server.http("POST", "/json", body).status for _ in range(6)]
    assert statuses == [200] * 5 + [429]
    r = server.http("POST", "/json", body)
    answer = r.json()
    assert answer["overallCode"] == "OVER_LIMIT"
    assert answer["statuses"][0]["code"] == "OVER_LIMIT"
    assert answer["statuses"][0]["currentLimit"] == {"requestsPerUnit": 5, "unit": "DAY"}
    bad = server.http("POST", "/json", "{\"domain\": 5}")
    assert bad.status == 400, bad
    assert "body" in bad.text


def test_health_and_reflection_name_the_service(rls):
    server, _, _ = rls
    with grpc.insecure_channel(server.grpc_target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        name = SERVICE.encode()
        assert check(b"\x0a" + bytes([len(name)]) + name, timeout=5) == b"\x08\x01"
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        listing = list(reflect(iter([b"\x3a\x00"]), timeout=5))
    assert SERVICE.encode() in listing[0]


def test_sighup_reloads_the_rule_files_keeping_counters(rls):
    server, stub, rules = rls
    number = [("to_number", "2065550000")]
    for _ in range(3):
        assert stub.ShouldRateLimit(envoy_request(number), timeout=ENVOY_TIMEOUT).overall_code == OK
    (rules / "messaging.yaml").write_text(MESSAGING.replace("requests_per_unit: 100",
                                                            "requests_per_unit: 4"))
    server.signal(signal.SIGHUP)
    wait_until(lambda: "reloaded" in server.log(), 10, what="the reload")
    answers = [stub.ShouldRateLimit(envoy_request(number), timeout=ENVOY_TIMEOUT)
               for _ in range(2)]
    # 3 of the new 4 were spent before the reload.
    assert [a.overall_code for a in answers] == [OK, OVER_LIMIT]
    assert answers[0].statuses[0].current_limit.requests_per_unit == 4


def test_validate_names_the_rule_file_line_and_column(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(MESSAGING.replace("unit: day\n      requests_per_unit: 100",
                                       "unit: fortnight\n      requests_per_unit: 100"))
    config = tmp_path / "sluice.yaml"
    config.write_text(config_for(rules))
    r = subprocess.run([sluice_bin(), "validate", str(config)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0
    assert f"{rules}:15:13: descriptors[1].rate_limit.unit: must be one of" in r.stderr + r.stdout
