"""Federated policies over gRPC and HTTP: two regions of one budget in one server (on the
embedded memory coordinator) never admit more than its limit in a window, and a refusal says
why (Decision.reason, HTTP `reason`, the CLI) and when to retry."""

import subprocess

from conftest import sluice_bin

CONFIG = """
policies:
  eu:
    kind: federated
    budget: api
    region: eu-west
    limit: 30
    window: 1m
    batch: 4
  us:
    kind: federated
    budget: api
    region: us-east
    limit: 30
    window: 1m
    batch: 4
"""


def test_regions_share_one_budget_and_say_why_they_refuse(start_server, key):
    server = start_server(CONFIG)
    client = server.client()
    k = key()
    decisions = [client.check("eu" if i % 2 == 0 else "us", k) for i in range(50)]
    assert sum(d.allowed for d in decisions) == 30
    last = decisions[-1]
    assert not last.allowed
    assert last.reason == "budget_spent"
    assert last.retry_after is not None and 0 < last.retry_after <= 60
    assert all(d.reason == "" for d in decisions if d.allowed)

    # Over HTTP: the same budget, the same reason.
    r = server.http("POST", "/v1/check", {"policy": "us", "key": k})
    assert r.status == 429, r
    body = r.json()
    assert body["reason"] == "budget_spent"

    # More hits than the limit can never pass.
    big = client.check("eu", key(), hits=31)
    assert not big.allowed and big.reason == "never_fits" and big.retry_after is None


def test_the_cli_shows_the_budget_and_the_reason(start_server, key):
    server = start_server(CONFIG)
    addr = f"127.0.0.1:{server.grpc_port}"
    table = subprocess.run([sluice_bin(), "policies", "--server", addr], capture_output=True,
                           text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    eu = next(line for line in table.stdout.splitlines() if line.startswith("eu "))
    assert "federated" in eu and "30" in eu and "per 1m in all regions (this one: eu-west)" in eu
    k = key()
    check = [sluice_bin(), "check", "eu", k, "--hits", "30", "--server", addr]
    assert subprocess.run(check, capture_output=True, text=True, timeout=30).returncode == 0
    denied = subprocess.run(check[:4] + ["--server", addr], capture_output=True, text=True,
                            timeout=30)
    assert denied.returncode == 1, denied.stderr
    assert "(budget_spent)" in denied.stdout
