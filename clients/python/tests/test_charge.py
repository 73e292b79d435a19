"""Charging after the response: a cost known once the call is over (the tokens a model call used)
charged to a key over gRPC (Client.charge), HTTP (POST /v1/charge), the CLI (`sluice charge`) and
a lease's release (`cost`); counted whatever the key has left, its overdraft waited out by later
checks. And a federated budget charged from three regions, three `sluice serve` on one real
Redis: what the charges take no region's check can have, the window's checks and charges never
spend more than its limit, and what no budget covered is forgiven with the window.

A fresh Redis counts the window of its first lease as spent (coordinator_restarted), so the
measured window is the one after it."""

import subprocess
import textwrap
import time

import pytest

import sluice_client
from conftest import sluice_bin

CONFIG = textwrap.dedent("""\
    policies:
      tokens:
        kind: rate
        strategy: fixed-window
        limit: 1000
        period: 1h
      llm:
        kind: adaptive
        algorithm: fixed
        limit: 4
        rate: tokens
    """)


def test_charges_over_grpc_http_the_cli_and_a_lease(start_server, key):
    server = start_server(CONFIG)
    client = server.client()
    addr = f"127.0.0.1:{server.grpc_port}"

    # gRPC: a check of what the call may cost, then what it did cost beyond it.
    k = key()
    assert client.check("tokens", k, hits=200).allowed
    c = client.charge("tokens", k, 950)  # it used 1,150
    assert (c.remaining, c.overdraft, c.pending, c.limit) == (0, 150, 0, 1000), c
    assert 0 < c.retry_after <= 3600 and c.retry_after == c.reset_after
    refused = client.check("tokens", k)
    assert not refused.allowed and refused.retry_after > 0
    back = client.charge("tokens", k, -400)  # negative: given back
    assert (back.remaining, back.overdraft) == (250, 0), back
    with pytest.raises(sluice_client.InvalidArgument, match="hits: must not be 0"):
        client.charge("tokens", k, 0)
    with pytest.raises(sluice_client.FailedPrecondition, match="Charge takes"):
        client.charge("llm", k, 1)

    # HTTP.
    h = key()
    r = server.http("POST", "/v1/charge", {"policy": "tokens", "key": h, "hits": 1200})
    assert r.status == 200, r
    assert r.json()["overdraft"] == 200 and r.json()["remaining"] == 0, r.json()
    assert server.http("POST", "/v1/check", {"policy": "tokens", "key": h}).status == 429
    bad = server.http("POST", "/v1/charge", {"policy": "tokens", "key": h, "hits": "5"})
    assert bad.status == 400 and "hits: must be an integer" in bad.text, bad.text

    # The CLI: a charge, a give-back (a negative number is the hits, not an option).
    cli = key()
    out = subprocess.run([sluice_bin(), "charge", "tokens", cli, "1010", "--server", addr],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "charged 1010 hits: 0 of 1000 remaining, 10 over the limit" in out.stdout, out.stdout
    out = subprocess.run([sluice_bin(), "charge", "tokens", cli, "-20", "--server", addr, "--json"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert '"remaining":10' in out.stdout, out.stdout

    # A lease's cost goes to the key its chained rate policy checked: the admit took 1.
    lk = key()
    with client.lease("llm", key=lk) as lease:
        lease.cost = 300
    assert lease.charged is not None and lease.charged.remaining == 700, lease.charged
    assert client.peek("tokens", lk, hits=700).allowed
    assert not client.peek("tokens", lk, hits=701).allowed
    admitted = subprocess.run([sluice_bin(), "admit", "llm", "--key", lk, "--server", addr],
                              capture_output=True, text=True, timeout=30)
    assert admitted.returncode == 0, admitted.stderr
    released = subprocess.run([sluice_bin(), "release", admitted.stdout.strip(), "--cost", "100",
                               "--server", addr], capture_output=True, text=True, timeout=30)
    assert released.returncode == 0, released.stderr
    assert "600 of 1000 remaining" in released.stdout, released.stdout

    state = client.policies().by_name["tokens"].state
    assert state["charged"] == 950 + 1200 + 1010 + 299 + 99, state
    assert state["overdrawn"] == 3, state


REGIONS = ("eu-west", "us-east", "ap-south")
WINDOW = 4  # seconds
LIMIT = 60


def federated_region(start_server, redis, region):
    return start_server(textwrap.dedent(f"""\
        coordinators:
          global:
            kind: redis
            address: 127.0.0.1:{redis.port}
        policies:
          tokens:
            kind: federated
            coordinator: global
            budget: tokens
            region: {region}
            limit: {LIMIT}
            window: {WINDOW}s
            batch: 4
        """))


def next_window(margin: float = 0.05) -> None:
    """Sleeps until just after the next window of WINDOW seconds starts (Redis's clock is this
    machine's)."""
    now = time.time()
    time.sleep((int(now) // WINDOW + 1) * WINDOW + margin - now)


def settled(clients, field, value, timeout=5.0):
    """Waits until the regions' `field` (their policy state) adds up to `value`; the sum."""
    deadline = time.monotonic() + timeout
    while True:
        total = sum(c.policies().by_name["tokens"].state[field] for c in clients)
        if total == value or time.monotonic() > deadline:
            return total
        time.sleep(0.02)


def test_charges_from_three_regions_take_one_budget_on_redis(start_server, redis, key):
    servers = [federated_region(start_server, redis, r) for r in REGIONS]
    clients = [s.client() for s in servers]
    k = key()
    first = clients[0].check("tokens", k)  # marks the fresh Redis: this window is spent
    assert not first.allowed and first.reason == "coordinator_restarted", first
    for attempt in range(3):  # again if a run did not fit in one window
        k = key()
        next_window()
        start = int(time.time()) // WINDOW
        eu, us, ap = clients
        assert eu.check("tokens", k).allowed  # eu leases a batch of 4, holds 3
        charged_eu = eu.charge("tokens", k, 40)  # 3 from escrow, 37 owed to the budget
        assert charged_eu.pending == 37, charged_eu
        us.charge("tokens", k, 15)  # no escrow in us: all 15 from the budget
        # The charges' leases run in the background; then 60 - 1 - 40 - 15 = 4 are left.
        assert settled(clients, "spent", 56) == 56
        admitted = 0
        for _ in range(5):
            for c in clients:
                admitted += c.check("tokens", k).allowed
        assert admitted == 4, admitted
        # Overdrawn: ap's charge finds the budget spent; forgiven, as the window ends.
        ap.charge("tokens", k, 30)
        forgiven = settled(clients, "forgiven", 30)
        refusals = [c.check("tokens", k) for c in clients]
        if int(time.time()) // WINDOW == start:
            break
    else:
        pytest.fail("the run never fit in one window")
    assert forgiven == 30, forgiven
    assert settled(clients, "spent", LIMIT) == LIMIT  # the budget, and not one unit more
    assert all(not d.allowed and d.reason == "budget_spent" for d in refusals), refusals
    assert sum(c.policies().by_name["tokens"].state["charged"] for c in clients) == 85
    next_window()
    assert us.check("tokens", k, hits=10).allowed, "the next window starts whole"
    print(f"\n[charge] 3 regions, one budget of {LIMIT}: charges 40 + 15 + 30, checks admitted "
          f"{admitted + 1}, spent {LIMIT}, forgiven {forgiven}")
