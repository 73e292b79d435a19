"""Shadow mode on a real `sluice serve`: a policy with `shadow: true` (or every policy, with
server.shadow_mode) never refuses; what it would have refused is allowed and says so
(`would_deny`) over gRPC, HTTP and the CLI, is counted in sluice_shadow_denied_total, and a
SIGHUP turns it off without a restart."""

import json
import signal
import subprocess
import textwrap

from conftest import metric, sluice_bin, wait_until

POLICIES = textwrap.dedent("""\
    policies:
      api:
        kind: rate
        {shadow}limit: 1
        period: 1m
      db:
        kind: adaptive
        {shadow}algorithm: fixed
        limit: 1
    """)


def config(shadow: bool) -> str:
    return POLICIES.format(shadow="shadow: true\n    " if shadow else "")


def test_shadow_allows_what_it_would_refuse_and_says_so(start_server):
    server = start_server(config(shadow=True))
    client = server.client()
    assert not client.check("api", "k").would_deny
    d = client.check("api", "k")
    assert d.allowed and d.would_deny, d
    assert d.retry_after and d.retry_after > 0, d  # what it would have answered

    r = server.http("POST", "/v1/check", {"policy": "api", "key": "k"})
    assert r.status == 200, r
    body = r.json()
    assert body["allowed"] is True and body["would_deny"] is True, body
    assert body["retry_after_ms"] > 0, body

    out = subprocess.run([sluice_bin(), "check", "api", "k", "--server", server.grpc_target],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out
    assert "allowed in shadow: the policy would deny it" in out.stdout, out.stdout

    first = client.admit("db", ttl=5)
    second = client.admit("db", ttl=5)
    assert not first.would_deny
    assert second.would_deny and second.rejection is not None, second
    assert second.rejection.status == 503, second.rejection
    admitted = server.http("POST", "/v1/admit", {"policy": "db"}).json()
    assert admitted["would_deny"] is True and admitted["rejection"]["status"] == 503, admitted
    assert client.policies()["db"].in_flight == 1  # the shadow leases hold no permit
    client.release(second)
    client.release(admitted["lease_id"])
    client.release(first)
    assert client.policies()["db"].in_flight == 0

    samples = server.metrics()
    assert metric(samples, "sluice_shadow_denied_total", policy="api") == 3
    assert metric(samples, "sluice_shadow_denied_total", policy="db") == 2
    assert client.policies()["api"].state["shadow"] is True

    # Enforce: the same file without shadow, picked up by SIGHUP.
    server.write_config(config(shadow=False))
    server.signal(signal.SIGHUP)
    wait_until(lambda: not client.check("api", "k").allowed, 10, what="enforcement")
    assert server.http("POST", "/v1/check", {"policy": "api", "key": "k"}).status == 429


def test_the_server_switch_puts_every_policy_in_shadow(start_server):
    server = start_server("server:\n  shadow_mode: true\n" + config(shadow=False))
    client = server.client()
    decisions = [client.check("api", "k") for _ in range(3)]
    assert all(d.allowed for d in decisions)
    assert [d.would_deny for d in decisions] == [False, True, True]
    out = subprocess.run([sluice_bin(), "check", "api", "k", "--json", "--server",
                          server.grpc_target], capture_output=True, text=True, timeout=30)
    assert json.loads(out.stdout)["would_deny"] is True, out
