"""Federated policies over gRPC and HTTP: two regions of one budget in one server (on the
embedded memory coordinator) never admit more than its limit in a window, and a refusal says
why (Decision.reason, HTTP `reason`, the CLI) and when to retry."""

import subprocess
import time

from conftest import metric, sluice_bin, wait_until


def two_regions(eu_limit: int, us_limit: int) -> str:
    return "policies:\n" + "".join(
        f"  {name}:\n    kind: federated\n    budget: api\n    region: {region}\n"
        f"    limit: {limit}\n    window: 1m\n    batch: 4\n"
        for name, region, limit in (("eu", "eu-west", eu_limit), ("us", "us-east", us_limit)))


CONFIG = two_regions(30, 30)


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


MISMATCH = two_regions(30, 50)  # a config rolled out to one region only


def test_a_region_with_another_spec_is_told_which_one_holds_the_budget(start_server, key):
    server = start_server(MISMATCH)
    client = server.client()
    keys = [key(), key()]
    for k in keys:
        assert client.check("eu", k).allowed  # eu fixes the window: 30 per 1m
    # Over gRPC (the first refusal: it waited for the lease the coordinator refused).
    refused = client.check("us", keys[0])
    assert not refused.allowed and refused.reason == "spec_mismatch", refused
    assert "holds this window's budget as 30 per 60s" in refused.detail, refused
    for k in keys:
        for _ in range(3):  # refused every time; told once per key and window
            r = server.http("POST", "/v1/check", {"policy": "us", "key": k})
            assert r.status == 429, r
            body = r.json()
            assert body["reason"] == "spec_mismatch", body
            assert "holds this window's budget as 30 per 60s" in body["detail"], body
            assert "this region asks 50 per 60s" in body["detail"], body
    # The server logs it from its sweeper (every 50 ms).
    wait_until(lambda: all(f"key '{k}'" in server.log() for k in keys), 5,
               what="the spec mismatch in the log")
    time.sleep(0.2)
    for k in keys:
        told = [line for line in server.log().splitlines() if f"key '{k}'" in line]
        assert len(told) == 1, told
        assert " warning: policy us: key" in told[0], told
        assert "holds this window's budget as 30 per 60s" in told[0], told
        assert "region us-east asks 50 per 60s" in told[0], told
    samples = server.metrics()
    assert metric(samples, "sluice_federated_spec_mismatches_total", policy="us") >= 2


def test_checks_of_many_units_get_what_they_need_or_hear_the_budget_is_short(start_server, key):
    regions = "".join(
        f"  {name}:\n    kind: federated\n    budget: api\n    region: {name}\n"
        f"    limit: 100\n    window: 1m\n    batch: 4\n" for name in ("eu", "us", "ap"))
    server = start_server("policies:\n" + regions)
    client = server.client()
    k = key()
    first, second, third = (client.check(p, k, hits=40) for p in ("eu", "us", "ap"))
    assert first.allowed and second.allowed, (first, second)
    assert not third.allowed and third.reason == "budget_short", third
    assert third.remaining == 20 and "(budget_short)" in third.detail, third
    assert client.check("ap", k, hits=20).allowed  # what is left still serves a check that fits
    spent = client.check("eu", k)
    assert not spent.allowed and spent.reason == "budget_spent", spent
