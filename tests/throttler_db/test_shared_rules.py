"""Rules shared by several sluice servers in front of one database, through a real Redis, a real
PostgreSQL and a real etcd coordinator the test starts itself: a throttle set on one server is enforced by
the two others, with its expiry; an unthrottle, an exemption and freno's skipped hosts travel the
same way; a restarted server has the rules before its first check; with the coordinator gone, a
change is refused (503, naming it) and the rules already read stay in force."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "tests"))
from conftest import SluiceServer, wait_until  # noqa: E402
from test_throttler import config as throttler_config  # noqa: E402

sys.path.append(str(ROOT / "tests" / "faults"))  # after: its conftest is not the one above
from harness import EtcdCluster, PostgresCoordinator, RedisCoordinator  # noqa: E402

INTERVAL = 0.1  # shared_rules_interval below
SEEN = 3.0  # how long a change may take to reach another server here (30 intervals)


@pytest.fixture(params=["redis", "postgres", "etcd"])
def coordinator(request, tmp_path):
    if request.param == "etcd":
        c = EtcdCluster(tmp_path, members=1)
    else:
        c = (RedisCoordinator if request.param == "redis" else PostgresCoordinator)(tmp_path)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def config(coordinator, value_file: Path) -> str:
    """The Python suite's throttler (metric depth from a file, shard main), its rules shared."""
    return (f"coordinators:\n  shared:\n{coordinator.config('127.0.0.1')}" +
            throttler_config(value_file, extra="    shared_rules: shared\n"
                                                "    shared_rules_interval: 100ms"))


def start(tmp_path: Path, name: str, coordinator, value_file: Path) -> SluiceServer:
    workdir = tmp_path / name
    workdir.mkdir(exist_ok=True)
    server = SluiceServer(workdir, config(coordinator, value_file), name=name)
    server.label = name
    return server.start()


def policy(server: SluiceServer) -> dict:
    return next(p for p in server.http("GET", "/v1/policies").json()["policies"]
                if p["name"] == "db")


def status(server: SluiceServer, app: str) -> int:
    return server.http("GET", f"/throttler/check?app={app}").status


def test_a_rule_set_on_one_server_is_enforced_by_the_others(coordinator, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    servers = [start(tmp_path, n, coordinator, value) for n in ("a", "b", "c")]
    a, b, c = servers
    try:
        for s in servers:
            wait_until(lambda s=s: status(s, "purge") == 200, 10, what=f"{s.label} passes")

        # freno's verb on a: b and c refuse the app within a few intervals.
        r = a.http("GET", "/throttle-app/purge/ttl/30/ratio/1")
        assert r.status == 200, r.text()
        assert r.json() == {"StatusCode": 200, "Message": "OK"}
        assert status(a, "purge") == 417  # the writer applies it before it answers
        for s in (b, c):
            wait_until(lambda s=s: status(s, "purge") == 417, SEEN, what=f"{s.label} refuses")
        listed = c.http("GET", "/throttled-apps").json()
        assert set(listed) == {"purge"}, listed
        assert listed["purge"]["Ratio"] == 1
        # The expiry is the same on every server (each on its own clock, from the coordinator's).
        left = [s.http("GET", "/throttler/throttled-apps").json()["apps"]["purge"]
                ["throttled_seconds_left"] for s in servers]
        assert all(29 * 60 < x <= 30 * 60 for x in left), left
        assert max(left) - min(left) < 2, left
        assert status(b, "other") == 200  # only that app

        # Vitess's unthrottle on b lifts it everywhere.
        r = b.http("GET", "/throttler/unthrottle-app?app=purge")
        assert r.status == 200, r.text()
        for s in servers:
            wait_until(lambda s=s: status(s, "purge") == 200, SEEN, what=f"{s.label} passes")

        # An exemption set on c holds on a while the metric is over its threshold.
        assert c.http("GET", "/throttler/exempt-app?app=backup").status == 200
        value.write_text("9\n")
        wait_until(lambda: status(a, "purge") == 429, 5, what="the metric over its threshold")
        wait_until(lambda: status(a, "backup") == 200, SEEN, what="a exempts backup")
        assert c.http("GET", "/throttler/exempt-app?app=backup&exempt=false").status == 200
        wait_until(lambda: status(a, "backup") == 429, SEEN, what="a no longer exempts it")
        value.write_text("1\n")
        wait_until(lambda: status(a, "backup") == 200, 5, what="the metric back under")

        # A throttle's end reaches every server, and then it is gone from every listing.
        r = a.http("GET", "/throttler/throttle-app?app=etl&duration=2s")
        assert r.status == 200, r.text()
        wait_until(lambda: status(c, "etl") == 417, SEEN, what="c refuses etl")
        wait_until(lambda: all(status(s, "etl") == 200 for s in servers), 5,
                   what="etl's throttle to end everywhere")
        time.sleep(3 * INTERVAL)
        for s in servers:
            assert s.http("GET", "/throttled-apps").json() == {}, s.label

        # freno's skipped hosts: the metric's only host skipped on b leaves the shard's metric
        # with no host, which counts as over, on a; recovered on c, a passes again.
        host = policy(a)["metrics"][0]["hosts"][0]["host"]
        assert b.http("GET", f"/skip-host/{host}/ttl/5").status == 200
        wait_until(lambda: status(a, "purge") == 429, SEEN, what="a leaves the host out")
        assert set(a.http("GET", "/skipped-hosts").json()) == {host}
        assert c.http("GET", f"/recover-host/{host}").status == 200
        wait_until(lambda: status(a, "purge") == 200, SEEN, what="a counts the host again")

        # A server restarted has the rules before its first check.
        assert a.http("GET", "/throttle-app/purge").status == 200
        b.stop()
        b = servers[1] = start(tmp_path, "b", coordinator, value)
        # Read before it served: its listing has the rule at once, and its first check refuses
        # the app (417; or 429 if the metric has no sample yet, which counts as over and comes
        # first), never passes it; once the metric has a sample, the rule is what refuses.
        assert set(b.http("GET", "/throttled-apps").json()) == {"purge"}
        assert status(b, "purge") in (417, 429)
        wait_until(lambda: status(b, "purge") == 417, SEEN, what="b refuses purge by the rule")
        state = policy(b)["shared_rules"]
        assert state["coordinator"] == "shared" and state["reads"] >= 1, state
        assert state["backend"] == coordinator.kind, state
    finally:
        for s in servers:
            s.stop()


def test_with_the_coordinator_gone_a_change_is_refused_and_the_rules_read_stay(coordinator,
                                                                             tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    a = start(tmp_path, "a", coordinator, value)
    b = start(tmp_path, "b", coordinator, value)
    try:
        assert a.http("GET", "/throttler/throttle-app?app=purge&duration=1h").status == 200
        wait_until(lambda: status(b, "purge") == 417, SEEN, what="b refuses purge")
        coordinator.stop()
        wait_until(lambda: policy(b)["shared_rules"].get("last_error"), 10,
                   what="b to see the coordinator gone")
        assert status(b, "purge") == 417  # kept
        assert status(b, "other") == 200
        r = b.http("GET", "/throttler/throttle-app?app=other&duration=1h")
        assert r.status == 503, (r.status, r.text())
        assert status(b, "other") == 200  # not applied here either
        failures = [v for k, v in b.metrics().items()
                    if k[0] == "sluice_throttler_shared_rules_read_failures_total"]
        assert failures and failures[0] >= 1, failures
    finally:
        a.stop()
        b.stop()
