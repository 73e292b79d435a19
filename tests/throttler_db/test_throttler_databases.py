"""The throttler against real replicas the suite starts itself (servers.py): a MariaDB primary and
replica, a PostgreSQL primary and streaming replica, a Redis primary and replica. Lag is made to
appear (a stopped SQL thread, paused WAL replay under writes) and must show as 429 with the lag
value and a reason, then 200 again once the replica catches up; a killed replica fails closed,
naming why; a SIGSTOPped MariaDB fails each sample at the probe's timeout (200 ms)."""

from __future__ import annotations

import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from servers import MariaDBPair, PostgresPair, RedisPair, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "tests"))
from conftest import SluiceServer  # noqa: E402


def serve(tmp_path: Path, metrics: str) -> SluiceServer:
    return SluiceServer(tmp_path, f"""
policies:
  db:
    kind: throttler
    shard: main
    fast_interval: 100ms
    dormant_interval: 100ms
    stale_intervals: 30
    metrics:
{metrics}
""").start()


def checked(server: SluiceServer, app: str = "purge") -> dict:
    r = server.http("GET", f"/throttler/check?app={app}")
    body = r.json()
    assert body["StatusCode"] == r.status, body
    return body


def metric_of(server: SluiceServer, name: str) -> dict:
    return checked(server)["Metrics"][name]


@pytest.fixture
def mariadb(tmp_path):
    pair = MariaDBPair(tmp_path / "mariadb")
    try:
        pair.start()
        pair.start_heartbeat(interval=0.1)
        yield pair
    finally:
        pair.stop()


def test_mariadb_replication_lag_and_heartbeat_lag_refuse_then_recover(mariadb, tmp_path):
    replica = f"127.0.0.1:{mariadb.replica_port}"
    primary = f"127.0.0.1:{mariadb.primary_port}"
    login = f"user: {MariaDBPair.THROTTLER_USER}\n        password: {MariaDBPair.THROTTLER_PASSWORD}"
    server = serve(tmp_path, f"""
      lag:
        probe: mysql_lag
        hosts: [{replica}]
        {login}
        threshold: 1
      beat:
        probe: mysql_heartbeat
        hosts: [{replica}]
        {login}
        heartbeat_table: meta.heartbeat
        threshold: 1
      busy:
        probe: mysql_threads_running
        hosts: [{primary}, {replica}]
        {login}
        ignore_hosts: 1
        threshold: 50
""")
    try:
        wait_until(lambda: checked(server)["StatusCode"] == 200, 15, what="200 from live replicas")
        body = checked(server)
        assert body["Metrics"]["lag"]["Value"] == 0, body
        assert 0 <= body["Metrics"]["beat"]["Value"] < 1, body
        assert body["Metrics"]["busy"]["Value"] >= 1, body  # the probe's own query runs

        # The SQL thread stops: Seconds_Behind_Master is NULL (lag unknown: fail closed) and
        # the heartbeat written on the primary stops arriving, so its lag grows past 1 s.
        mariadb.stop_sql_thread()
        mariadb.write_load(500)
        wait_until(lambda: metric_of(server, "beat")["Value"] > 1.0, 15,
                   what="heartbeat lag over 1 s")
        body = checked(server)
        assert body["StatusCode"] == 429, body
        assert body["Metrics"]["beat"]["reason"] == "threshold_exceeded", body
        assert body["Metrics"]["lag"]["reason"] == "probe_failed", body
        assert "replication is not running" in body["Metrics"]["lag"]["Message"], body
        assert "SQL thread No" in body["Metrics"]["lag"]["Message"], body
        assert body["reason"] in ("probe_failed", "threshold_exceeded"), body
        assert server.http("HEAD", "/throttler/check?app=gh-ost").status == 429

        mariadb.start_sql_thread()
        mariadb.wait_replica_caught_up(15)
        wait_until(lambda: checked(server)["StatusCode"] == 200, 15, what="200 after catching up")
        assert metric_of(server, "beat")["Value"] < 1.0

        # The replica dies: both replica metrics fail closed, naming the connection; the
        # threads metric ignores one bad host of its two and still passes.
        mariadb.kill_replica()
        wait_until(lambda: "cannot connect" in metric_of(server, "lag")["Message"], 15,
                   what="the dead replica named")
        body = checked(server)
        assert body["StatusCode"] == 429, body
        assert body["Metrics"]["beat"]["reason"] == "probe_failed", body
        assert body["Metrics"]["busy"]["StatusCode"] == 200, body
        assert server.http("HEAD", "/check/purge/mysql/main").status == 429
    finally:
        server.stop()


@pytest.fixture
def postgres(tmp_path):
    pair = PostgresPair(tmp_path / "postgres")
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


def failed_sample_starts(server: SluiceServer, metric: str, error: str, seconds: float) -> list:
    """When each failed sample of `metric`'s first host whose error has `error` started, on the
    test's clock (seen now, less the sample's age), watched for `seconds`."""
    starts = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        policies = server.http("GET", "/v1/policies").json()["policies"]
        seen = time.monotonic()
        db = next(p for p in policies if p["name"] == "db")
        host = next(m for m in db["metrics"] if m["name"] == metric)["hosts"][0]
        if error in host.get("error", "") and "age_seconds" in host:
            start = seen - host["age_seconds"]
            if not starts or start - starts[-1] > 0.05:  # a sample not seen yet
                starts.append(start)
        time.sleep(0.01)
    return starts


def test_mariadb_probe_timeout_bounds_each_sample_of_a_hung_server(mariadb, tmp_path):
    """A probe `timeout` below a second bounds a host's whole sample: with the server SIGSTOPped
    (the kernel still takes connections for it), the query on the open connection, then every
    reconnect, fails at 200 ms, so a failed sample follows another every 200 ms (at most 1.5 x
    that), where libmariadb's blocking timeouts, whole seconds per phase, took a second or
    more each. Sampling recovers once the server runs again."""
    primary = f"127.0.0.1:{mariadb.primary_port}"
    server = serve(tmp_path, f"""
      busy:
        probe: mysql_threads_running
        hosts: [{primary}]
        user: {MariaDBPair.THROTTLER_USER}
        password: {MariaDBPair.THROTTLER_PASSWORD}
        timeout: 200ms
        threshold: 50
""")
    try:
        wait_until(lambda: checked(server)["StatusCode"] == 200, 15, what="200 from the primary")
        mariadb.servers["primary"].signal(signal.SIGSTOP)
        try:
            starts = failed_sample_starts(server, "busy", "no answer within 200 ms", 3.0)
            body = checked(server)
        finally:
            mariadb.servers["primary"].signal(signal.SIGCONT)
        assert body["StatusCode"] == 429 and body["Metrics"]["busy"]["reason"] == "probe_failed"
        # Each failed sample starts the next at once (the fast interval, 100 ms, is shorter), so
        # the time between two starts is how long a sample took.
        took = [b - a for a, b in zip(starts, starts[1:])]
        assert len(took) >= 5, (starts, took)
        assert statistics.median(took) <= 0.3, took
        assert max(took) < 0.45, took
        wait_until(lambda: checked(server)["StatusCode"] == 200, 15, what="200 after SIGCONT")
    finally:
        server.stop()


def test_postgres_replica_lag_refuses_then_recovers_and_an_idle_primary_is_no_lag(
        postgres, tmp_path):
    base = f"user={postgres.user} dbname=postgres connect_timeout=2"
    server = serve(tmp_path, f"""
      replica_lag:
        probe: postgres_lag
        hosts: [127.0.0.1:{postgres.replica_port}]
        conninfo: "{base}"
        threshold: 1
      primary_lag:
        probe: postgres_lag
        hosts: [127.0.0.1:{postgres.primary_port}]
        conninfo: "{base}"
        threshold: 30
      active:
        probe: postgres_active
        hosts: [127.0.0.1:{postgres.primary_port}]
        conninfo: "{base}"
        threshold: 100
""")
    try:
        wait_until(lambda: checked(server)["StatusCode"] == 200, 15, what="200 from a live pair")
        # An idle primary: the last replayed transaction grows old, but nothing is outstanding,
        # so the lag is 0, not its age.
        time.sleep(2.5)
        body = checked(server)
        assert body["StatusCode"] == 200, body
        assert body["Metrics"]["replica_lag"]["Value"] == 0, body
        assert body["Metrics"]["active"]["Value"] >= 0, body

        # Replay paused while the primary keeps writing: the replica's lag grows past 1 s.
        postgres.pause_replay()
        stop = threading.Event()

        def writer():
            while not stop.is_set():
                postgres.write_load(10)
                time.sleep(0.1)

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        try:
            wait_until(lambda: metric_of(server, "replica_lag")["Value"] > 1.0, 20,
                       what="replica lag over 1 s")
            body = checked(server)
            assert body["StatusCode"] == 429, body
            assert body["MetricName"] == "replica_lag", body
            assert body["reason"] == "threshold_exceeded" and body["value"] > 1.0, body
            assert "over its threshold" in body["Message"], body
        finally:
            stop.set()
            t.join()
        postgres.resume_replay()
        postgres.wait_replica_caught_up(15)
        wait_until(lambda: checked(server)["StatusCode"] == 200, 15, what="200 after resuming")

        # The replica dies: its metric fails closed naming the connection, and the primary's
        # says no replica streams.
        postgres.kill_replica()
        wait_until(lambda: metric_of(server, "replica_lag")["reason"] == "probe_failed", 15,
                   what="the dead replica")
        wait_until(lambda: "no replica is streaming" in metric_of(server, "primary_lag")["Message"],
                   15, what="the primary's view")
        assert server.http("HEAD", "/throttler/check?app=x").status == 429
    finally:
        server.stop()


def test_redis_info_fields_and_replica_offset_lag(tmp_path):
    pair = RedisPair(tmp_path / "redis")
    try:
        pair.start()
        pair.wait_replica_linked()
        primary = f"127.0.0.1:{pair.primary_port}"
        replica = f"127.0.0.1:{pair.replica_port}"
        server = serve(tmp_path, f"""
      clients:
        probe: redis
        hosts: [{primary}]
        field: connected_clients
        threshold: 100
      offset:
        probe: redis
        hosts: [{primary}]
        field: replica_offset_lag
        threshold: 100000000
      on_replica:
        probe: redis
        hosts: [{replica}]
        field: replica_offset_lag
        threshold: 1
""")
        try:
            wait_until(lambda: metric_of(server, "offset")["StatusCode"] == 200, 15,
                       what="the offset lag sampled")
            body = checked(server)
            assert body["Metrics"]["clients"]["Value"] >= 1, body
            assert body["Metrics"]["offset"]["Value"] >= 0, body
            assert "measured on the primary" in body["Metrics"]["on_replica"]["Message"], body
            pair.kill_replica()
            wait_until(lambda: "no replica is connected" in metric_of(server, "offset")["Message"],
                       15, what="the primary without its replica")
        finally:
            server.stop()
    finally:
        pair.stop()
