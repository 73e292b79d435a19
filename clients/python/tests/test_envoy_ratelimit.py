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
    """A RateLimitRequest with these descriptors (each a list of (key, value) entries)."""
    req = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits_addend)
    for entries in descriptors:
        d = req.descriptors.add()
        for key, value in entries:
            d.entries.add(key=key, value=value)
    return req


def envoy_filter_request(domain, rate_limits, headers, remote_address, cluster="backend"):
    """What Envoy's HTTP rate limit filter sends for one downstream request: one descriptor per
    entry of the route's `rate_limits`, its entries made by the entry's actions in order
    (request_headers: (descriptor_key, the header's value); remote_address: ("remote_address",
    the client's address); generic_key: (descriptor_key or "generic_key", descriptor_value);
    destination_cluster: ("destination_cluster", the routed cluster)). An entry with a
    request_headers action whose header is absent sends no descriptor. hits_addend is left
    unset (Envoy sets it only from the filter state envoy.ratelimit.hits_addend)."""
    descriptors = []
    for actions in rate_limits:
        entries = []
        for action, spec in actions:
            if action == "request_headers":
                if spec["header_name"] not in headers:
                    entries = None
                    break
                entries.append((spec["descriptor_key"], headers[spec["header_name"]]))
            elif action == "remote_address":
                entries.append(("remote_address", remote_address))
            elif action == "generic_key":
                entries.append((spec.get("descriptor_key", "generic_key"),
                                spec["descriptor_value"]))
            elif action == "destination_cluster":
                entries.append(("destination_cluster", cluster))
            else:
                raise ValueError(action)
        if entries:
            descriptors.append(entries)
    return envoy_request(*descriptors, domain=domain)


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


# envoyproxy/ratelimit's README, example 3, as it is there.
PER_IP = textwrap.dedent("""\
    domain: edge_proxy_per_ip
    descriptors:
      - key: remote_address
        rate_limit:
          unit: second
          requests_per_unit: 10

      # Black list IP
      - key: remote_address
        value: 50.0.0.5
        rate_limit:
          unit: second
          requests_per_unit: 0
""")


def test_an_envoy_route_with_several_rate_limits(start_server, tmp_path):
    """A route limiting per client address and per marketing number, as Envoy's filter asks."""
    rules = tmp_path / "config"
    rules.mkdir()
    (rules / "per_ip.yaml").write_text(PER_IP)
    (rules / "messaging.yaml").write_text(MESSAGING)
    server = start_server(config_for(rules))
    route_limits = [
        [("remote_address", {})],
        [("request_headers", {"header_name": "x-message-type", "descriptor_key": "message_type"}),
         ("request_headers", {"header_name": "x-to", "descriptor_key": "to_number"})],
    ]
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)

        def ask(domain, headers, address):
            req = envoy_filter_request(domain, route_limits, headers, address)
            return stub.ShouldRateLimit(req, timeout=ENVOY_TIMEOUT)

        # The per-IP domain: the address's descriptor has a limit; the header pair has none
        # there (another domain's rule), so it is OK with no limit.
        marketing = {"x-message-type": "marketing", "x-to": "2061111111"}
        first = ask("edge_proxy_per_ip", marketing, "50.0.0.1")
        assert len(first.statuses) == 2
        assert first.statuses[0].current_limit.requests_per_unit == 10
        assert not first.statuses[1].HasField("current_limit")
        # The blocked address is refused at once, whatever else the request carries.
        assert ask("edge_proxy_per_ip", {}, "50.0.0.5").overall_code == OVER_LIMIT
        # A request without the headers sends the address's descriptor only.
        assert len(ask("edge_proxy_per_ip", {}, "50.0.0.2").statuses) == 1
        # The messaging domain: 5 marketing messages a day to a number.
        codes = [ask("messaging", marketing, "50.0.0.3").overall_code for _ in range(6)]
        assert codes == [OK] * 5 + [OVER_LIMIT]


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


def test_a_port_of_its_own_as_envoyproxy_ratelimits_8081(start_server, tmp_path):
    from conftest import free_port
    rules = tmp_path / "messaging.yaml"
    rules.write_text(MESSAGING)
    port = free_port()
    server = start_server(f"server:\n  envoy_grpc: 127.0.0.1:{port}\n" + config_for(rules))
    assert f"envoy grpc 127.0.0.1:{port}" in server.log()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        answer = stub.ShouldRateLimit(envoy_request([("to_number", "1")]), timeout=ENVOY_TIMEOUT)
    assert answer.statuses[0].current_limit.requests_per_unit == 100
    # A reload cannot move it: the old config keeps serving, and says why.
    server.write_config(config_for(rules))
    server.signal(signal.SIGHUP)
    wait_until(lambda: "reload rejected" in server.log(), 10, what="the refused reload")
    assert "server.envoy_grpc" in server.log()


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
