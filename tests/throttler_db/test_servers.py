"""Self-check of servers.py: each pair starts, replicates, and shows the lag the throttler's tests
will rely on (a stopped SQL thread, paused WAL replay), then catches up."""

from __future__ import annotations

import time

from servers import MariaDBPair, PostgresPair, RedisPair, wait_until

LAG_SQL = ("SELECT TIMESTAMPDIFF(MICROSECOND, STR_TO_DATE(ts, '%Y-%m-%dT%H:%i:%s.%f'), "
           "UTC_TIMESTAMP(6))/1e6 FROM meta.heartbeat")


def test_mariadb_pair(tmp_path):
    pair = MariaDBPair(tmp_path)
    try:
        pair.start()
        wait_until(lambda: pair.replica_status().get("Seconds_Behind_Master") == "0", 10,
                   what="Seconds_Behind_Master 0")

        pair.start_heartbeat(interval=0.1)
        wait_until(lambda: pair.sql("replica", "SELECT COUNT(*) FROM meta.heartbeat")
                   == [["1"]], 10, what="the heartbeat row on the replica")
        assert float(pair.sql("replica", LAG_SQL)[0][0]) < 1.0

        pair.stop_sql_thread()
        pair.write_load(1000)
        time.sleep(1.5)
        lag = float(pair.sql("replica", LAG_SQL)[0][0])
        assert lag > 1.0, lag
        # The primary's own row is fresh: the replica is the one behind.
        assert float(pair.sql("primary", LAG_SQL)[0][0]) < 0.5
        assert pair.replica_status()["Seconds_Behind_Master"] == "NULL"

        pair.start_sql_thread()
        pair.wait_replica_caught_up(10)
        wait_until(lambda: float(pair.sql("replica", LAG_SQL)[0][0]) < 0.5, 5,
                   what="the replica's heartbeat to catch up")
        assert pair.sql("replica", "SELECT COUNT(*) FROM meta.load_rows") == [["1000"]]

        rows = pair.sql("replica", "SHOW SLAVE STATUS", user="throttler", password="throttler")
        assert len(rows) == 1
        assert pair.sql("replica", "SELECT COUNT(*) FROM meta.heartbeat", user="throttler",
                        password="throttler") == [["1"]]
        pair.sql("replica", "SHOW GLOBAL STATUS LIKE 'Uptime'", user="throttler",
                 password="throttler")
        assert pair.heartbeat.error is None and pair.heartbeat.beats >= 15

        pair.kill_replica()
        assert not pair.servers["replica"].running()
    finally:
        pair.stop()


def test_postgres_pair(tmp_path):
    pair = PostgresPair(tmp_path)
    try:
        pair.start()
        assert pair.query("replica", "SELECT pg_is_in_recovery()") == [["t"]]
        assert len(pair.query("primary", "SELECT * FROM pg_stat_replication")) == 1

        pair.pause_replay()
        pair.write_load(1000)
        wait_until(lambda: pair.query(
            "replica", "SELECT pg_last_wal_receive_lsn() <> pg_last_wal_replay_lsn()")
                   == [["t"]], 5, what="received WAL not replayed")
        time.sleep(1.2)
        lag = float(pair.query(
            "replica", "SELECT extract(epoch FROM now() - pg_last_xact_replay_timestamp())")[0][0])
        assert lag > 1.0, lag

        pair.resume_replay()
        pair.wait_replica_caught_up(10)
        assert pair.query("replica", "SELECT count(*) FROM load_rows") == [["1000"]]
        pair.write_load(1)
        pair.wait_replica_caught_up(10)
        assert pair.query(
            "replica", "SELECT pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()") == [["t"]]
        lag = float(pair.query(
            "replica", "SELECT extract(epoch FROM now() - pg_last_xact_replay_timestamp())")[0][0])
        assert lag < 1.0, lag
        assert "port=" in pair.conninfo("replica")

        pair.kill_replica()
        assert not pair.servers["replica"].running()
    finally:
        pair.stop()


def test_redis_pair(tmp_path):
    pair = RedisPair(tmp_path)
    try:
        pair.start()
        assert "master_link_status:up" in pair.cli("replica", "INFO", "replication")
        pair.cli("primary", "SET", "k", "v")
        wait_until(lambda: pair.cli("replica", "GET", "k") == "v", 5, what="k on the replica")
        pair.kill_replica()
        assert not pair.servers["replica"].running()
    finally:
        pair.stop()
