"""Real database replicas for the throttler's tests: a MariaDB primary and GTID replica (with a
pt-heartbeat-shaped heartbeat table), a PostgreSQL primary and streaming replica, a Redis
primary and replica. Each pair runs on 127.0.0.1 only, on free ports, in directories of its own,
and can make replication lag appear (a stopped SQL thread, paused WAL replay, a killed replica).

Every server is started as a simple command (its pid is the server), dies with the test process
(tests/faults/harness.py's parent-death signal) and is stopped by its pid: MariaDB and Redis with
SIGTERM, PostgreSQL with SIGINT (fast shutdown). A start that does not come up raises an
AssertionError with the tail of the server's log.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS / "faults"))
sys.path.insert(0, str(_TESTS.parent / "clients" / "python"))

# harness.py imports sluice_client, which needs the stubs generated at build time; nothing used
# here needs it, so without the stubs harness gets a placeholder, dropped again afterwards (a
# later `import sluice_client` fails with its own message).
try:
    import sluice_client  # noqa: F401
    import harness
except ImportError:
    sys.modules["sluice_client"] = types.ModuleType("sluice_client")
    try:
        import harness
    finally:
        del sys.modules["sluice_client"]

from harness import PG_BIN, descendants, free_port, spawn, tail, wait_until  # noqa: E402

MARIADBD = "/usr/sbin/mariadbd"
LOOPBACK = "127.0.0.1"

HEARTBEAT_TABLE = """CREATE TABLE meta.heartbeat (
  ts                    varchar(26) NOT NULL,
  server_id             int unsigned NOT NULL PRIMARY KEY,
  file                  varchar(255) DEFAULT NULL,
  position              bigint unsigned DEFAULT NULL,
  relay_master_log_file varchar(255) DEFAULT NULL,
  exec_master_log_pos   bigint unsigned DEFAULT NULL
)"""

# What pt-heartbeat --utc writes: the primary's UTC time, ISO 8601 with microseconds.
HEARTBEAT_WRITE = ("REPLACE INTO meta.heartbeat (ts, server_id) VALUES "
                   "(DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%f'), 1)")

# On the replica: how far its heartbeat row is behind its own clock (seconds).
HEARTBEAT_LAG = ("SELECT TIMESTAMPDIFF(MICROSECOND, STR_TO_DATE(ts, '%Y-%m-%dT%H:%i:%s.%f'), "
                 "UTC_TIMESTAMP(6))/1e6 FROM meta.heartbeat WHERE server_id = 1")


def _fail(what: str, *logs: Path) -> AssertionError:
    return AssertionError(what + "".join(f"\n--- {p} ---\n{tail(p)}" for p in logs))


def _wait(predicate: Callable[[], object], timeout: float, what: str, *logs: Path):
    """wait_until, whose timeout error carries the tails of `logs`."""
    try:
        return wait_until(predicate, timeout, interval=0.05, what=what)
    except AssertionError as e:
        raise _fail(str(e), *logs) from None


class Server:
    """One server process the test owns, started as a simple command (its pid is the server)."""

    def __init__(self, name: str, args: Sequence[str], log: Path, user: Optional[str] = None,
                 stop_signal: int = signal.SIGTERM):
        self.name, self.args, self.log, self.user = name, list(args), log, user
        self.stop_signal = stop_signal
        self.proc: Optional[subprocess.Popen] = None

    def start(self, ready: Callable[[], bool], timeout: float) -> None:
        """Starts it and waits for `ready`; an exit or a timeout raises with the log's tail."""
        self.proc = spawn(self.args, self.log, user=self.user)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise _fail(f"{self.name} exited at start ({self.proc.returncode})", self.log)
            if ready():
                return
            if time.monotonic() > deadline:
                raise _fail(f"{self.name} did not start within {timeout}s", self.log)
            time.sleep(0.05)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Signals the server only if it still runs."""
        if self.running():
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> None:
        """Waits for it to exit; SIGKILL (it and its processes) after `timeout`."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def stop(self, timeout: float = 20.0) -> None:
        self.signal(self.stop_signal)
        self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL to the server and every process below it; waits until all are gone."""
        if self.proc is None:
            return
        family = descendants(self.proc.pid) if self.running() else []
        self.signal(signal.SIGKILL)
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        wait_until(lambda: not any(harness._running(p) for p in family), 10,
                   what=f"{self.name}'s processes to die")


def _stop_pair(servers: Dict[str, Server]) -> None:
    """Stops the replica, then the primary (each a few tens of milliseconds when idle)."""
    for which in ("replica", "primary"):
        if which in servers:
            servers[which].stop(20)


# ---- MariaDB ----

def _gtid_seqs(pos: str) -> Dict[str, int]:
    """{domain: seq_no} of a GTID position such as "0-1-42,1-7-3"."""
    out = {}
    for gtid in filter(None, (g.strip() for g in pos.split(","))):
        domain, _, seq = gtid.split("-")
        out[domain] = int(seq)
    return out


class Heartbeat:
    """A pt-heartbeat writer on the primary: every `interval`, HEARTBEAT_WRITE sent to ONE
    persistent `mariadb` client (batch mode, fed through its stdin) from a background thread."""

    def __init__(self, port: int, log: Path, interval: float = 0.1):
        self.port, self.log, self.interval = port, log, interval
        self.beats = 0
        self.error: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._out = None
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            harness.die_with_parent(
                ["mariadb", "--no-defaults", "--protocol=TCP", "-h", LOOPBACK, "-P",
                 str(self.port), "-u", "root", "--batch", "--unbuffered", "--force",
                 "--connect-timeout=3", "meta"]),
            stdin=subprocess.PIPE, stdout=self._out, stderr=self._out, **harness.child_options())
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        line = (HEARTBEAT_WRITE + ";\n").encode()
        next_at = time.monotonic()
        while not self._stop.is_set():
            if self.proc.poll() is not None:
                self.error = f"mariadb client exited ({self.proc.returncode})"
                return
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as e:
                self.error = f"writing to the mariadb client: {e}"
                return
            self.beats += 1
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stops the thread, then the client (its stdin closed; SIGKILL if it lingers)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._out is not None:
            self._out.close()
            self._out = None


class MariaDBPair:
    """A MariaDB primary (binary log, server-id 1) and one replica (server-id 2) replicating
    from it with GTID (MASTER_USE_GTID=slave_pos), each in workdir/mariadb/<primary|replica>.

    Users (made on the primary, replicated): root without a password (TCP from 127.0.0.1),
    `repl`/`repl` (REPLICATION SLAVE) and `throttler`/`throttler` (replication monitoring, SHOW
    GLOBAL STATUS, SELECT on `meta`), each for '%' and 'localhost'; the install's anonymous
    users are dropped (they shadow '%' accounts from localhost). Database `meta` holds
    pt-heartbeat's `heartbeat` table and `load_rows` for write_load()."""

    THROTTLER_USER = "throttler"
    THROTTLER_PASSWORD = "throttler"
    REPL_USER = "repl"
    REPL_PASSWORD = "repl"

    def __init__(self, workdir: Path):
        self.dir = Path(workdir) / "mariadb"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.primary_port, self.replica_port = free_port(), free_port()
        self._sock_dir: Optional[Path] = None
        self.servers: Dict[str, Server] = {}
        self.heartbeat: Optional[Heartbeat] = None

    # -- lifecycle --

    def _port(self, which: str) -> int:
        assert which in ("primary", "replica"), which
        return self.primary_port if which == "primary" else self.replica_port

    def _socket(self, which: str) -> Path:
        # A Unix socket path holds at most 107 bytes: a deep workdir gets one under /tmp.
        sock = self.dir / which / "mariadb.sock"
        if len(str(sock)) <= 100:
            return sock
        if self._sock_dir is None:
            self._sock_dir = Path(tempfile.mkdtemp(prefix="sluice-my-"))
        return self._sock_dir / f"{which}.sock"

    def _install(self) -> None:
        """mariadb-install-db for both data directories (fresh ones), run together."""
        runs = []
        for which in ("primary", "replica"):
            home = self.dir / which
            shutil.rmtree(home / "data", ignore_errors=True)
            home.mkdir(parents=True, exist_ok=True)
            log = home / "install.log"
            # Each its own temporary directory: two bootstraps sharing /tmp sometimes collide
            # ("Unknown table 'mysql.tmp_user_sys'").
            tmp = home / "tmp"
            tmp.mkdir(exist_ok=True)
            runs.append((which, log, spawn(
                ["mariadb-install-db", "--no-defaults", f"--datadir={home / 'data'}",
                 "--user=root", "--auth-root-authentication-method=normal", f"--tmpdir={tmp}",
                 *self._small()],
                log, env={**os.environ, "TMPDIR": str(tmp)})))
        for which, log, p in runs:
            if p.wait(120) != 0:
                raise _fail(f"mariadb-install-db ({which}) failed", log)

    @staticmethod
    def _small() -> List[str]:
        # Small and fast: 16 MB buffer pool, 8 MB redo log (the install's 100 MB otherwise),
        # no per-commit flush, no DNS, simulated AIO (no io_setup() quota to run out of).
        return ["--skip-name-resolve", "--innodb-buffer-pool-size=16M",
                "--innodb-log-file-size=8M", "--innodb-flush-log-at-trx-commit=2",
                "--innodb-use-native-aio=0", "--innodb-buffer-pool-dump-at-shutdown=0",
                "--innodb-buffer-pool-load-at-startup=0"]

    def _server(self, which: str, server_id: int, extra: Sequence[str]) -> Server:
        home = self.dir / which
        args = [MARIADBD, "--no-defaults", f"--datadir={home / 'data'}",
                f"--socket={self._socket(which)}", f"--port={self._port(which)}",
                f"--bind-address={LOOPBACK}", "--user=root", f"--server-id={server_id}",
                f"--pid-file={home / 'mariadbd.pid'}", "--max-connections=50",
                f"--tmpdir={home / 'tmp'}", *self._small(),
                *extra]
        return Server(f"mariadb {which}", args, home / "server.log")

    def _accepts(self, which: str) -> bool:
        try:
            return self._client(which, "SELECT 1", check=False, timeout=5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self, timeout: float = 60.0) -> None:
        """Installs both data directories, starts the primary (users, `meta` made there), then
        the replica, and waits until it replicates and has caught up."""
        deadline = time.monotonic() + timeout
        self._install()
        primary = self._server("primary", 1, ["--log-bin=mysql-bin", "--binlog-format=ROW"])
        self.servers["primary"] = primary
        primary.start(lambda: self._accepts("primary"), deadline - time.monotonic())
        users = []
        for host in ("%", "localhost"):
            users += [
                f"CREATE USER '{self.REPL_USER}'@'{host}' IDENTIFIED BY '{self.REPL_PASSWORD}'",
                f"GRANT REPLICATION SLAVE ON *.* TO '{self.REPL_USER}'@'{host}'",
                f"CREATE USER '{self.THROTTLER_USER}'@'{host}' "
                f"IDENTIFIED BY '{self.THROTTLER_PASSWORD}'",
                # REPLICATION CLIENT is BINLOG MONITOR since 10.5; SHOW SLAVE STATUS needs
                # SLAVE MONITOR (10.5.9+).
                f"GRANT REPLICATION CLIENT, SLAVE MONITOR ON *.* TO "
                f"'{self.THROTTLER_USER}'@'{host}'",
                f"GRANT SELECT ON meta.* TO '{self.THROTTLER_USER}'@'{host}'",
            ]
        anonymous = [f"DROP USER IF EXISTS ''@'{row[0]}'"
                     for row in self.sql("primary", "SELECT host FROM mysql.user WHERE user = ''")]
        self.sql("primary", ";\n".join([
            *anonymous, "CREATE DATABASE meta", HEARTBEAT_TABLE,
            "CREATE TABLE meta.load_rows (id bigint unsigned AUTO_INCREMENT PRIMARY KEY, "
            "pad varchar(255) NOT NULL)",
            *users]))
        replica = self._server("replica", 2, ["--relay-log=relay-bin"])
        self.servers["replica"] = replica
        replica.start(lambda: self._accepts("replica"), max(1.0, deadline - time.monotonic()))
        self.sql("replica", (
            f"CHANGE MASTER TO MASTER_HOST='{LOOPBACK}', MASTER_PORT={self.primary_port}, "
            f"MASTER_USER='{self.REPL_USER}', MASTER_PASSWORD='{self.REPL_PASSWORD}', "
            f"MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos; START SLAVE"))
        remaining = max(1.0, deadline - time.monotonic())
        _wait(lambda: self._replicating(), remaining, "the replica's IO and SQL threads",
              replica.log, primary.log)
        self.wait_replica_caught_up(max(1.0, deadline - time.monotonic()))

    def _replicating(self) -> bool:
        st = self.replica_status()
        return st.get("Slave_IO_Running") == "Yes" and st.get("Slave_SQL_Running") == "Yes"

    def stop(self) -> None:
        """Stops the heartbeat and both servers (SIGTERM, the replica first; SIGKILL after 20 s);
        a server already dead or never started is skipped. Removes the data directories (the
        logs stay)."""
        self.stop_heartbeat()
        _stop_pair(self.servers)
        for which in ("primary", "replica"):
            shutil.rmtree(self.dir / which / "data", ignore_errors=True)
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None

    # -- SQL --

    def _client(self, which: str, statement: str, user: str = "root", password: str = "",
                names: bool = False, check: bool = True,
                timeout: float = 30) -> subprocess.CompletedProcess:
        args = ["mariadb", "--no-defaults", "--protocol=TCP", "-h", LOOPBACK,
                "-P", str(self._port(which)), "-u", user, "--batch", "--connect-timeout=3"]
        if password:
            args.append(f"--password={password}")
        if not names:
            args.append("--skip-column-names")
        r = subprocess.run([*args, "-e", statement], capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"mariadb ({which}, {user}): {statement}: {r.stderr.strip()}")
        return r

    def sql(self, which: str, statement: str, user: str = "root",
            password: str = "") -> List[List[str]]:
        """Rows of `statement` (one or more, `;`-separated) on "primary" or "replica", run with
        the `mariadb` client over TCP (batch mode: tab-separated, NULL as "NULL")."""
        r = self._client(which, statement, user, password)
        return [line.split("\t") for line in r.stdout.splitlines()]

    def replica_status(self) -> Dict[str, str]:
        """SHOW SLAVE STATUS on the replica as {column: value} ({} when not a replica)."""
        lines = self._client("replica", "SHOW SLAVE STATUS", names=True).stdout.splitlines()
        if len(lines) < 2:
            return {}
        return dict(zip(lines[0].split("\t"), lines[1].split("\t")))

    def stop_sql_thread(self) -> None:
        self.sql("replica", "STOP SLAVE SQL_THREAD")

    def start_sql_thread(self) -> None:
        self.sql("replica", "START SLAVE SQL_THREAD")

    def kill_replica(self) -> None:
        """SIGKILL to the replica's server; waits until it is gone."""
        replica = self.servers.get("replica")
        if replica is not None:
            replica.kill()

    def wait_replica_caught_up(self, timeout: float = 10.0) -> None:
        """Waits until the replica has applied every transaction the primary had logged when
        called (its gtid_slave_pos reaches the primary's gtid_binlog_pos in every domain)."""
        target = _gtid_seqs(self.sql("primary", "SELECT @@gtid_binlog_pos")[0][0])

        def caught_up() -> bool:
            done = _gtid_seqs(self.sql("replica", "SELECT @@gtid_slave_pos")[0][0])
            return all(done.get(d, -1) >= seq for d, seq in target.items())

        _wait(caught_up, timeout, f"the replica to apply {target}",
              self.servers["replica"].log)

    def write_load(self, rows: int) -> None:
        """Inserts `rows` rows (200 bytes each) into meta.load_rows on the primary, one
        transaction."""
        self.sql("primary", "INSERT INTO meta.load_rows (pad) "
                            f"SELECT REPEAT('x', 200) FROM meta.seq_1_to_{int(rows)}")

    # -- heartbeat --

    def start_heartbeat(self, interval: float = 0.1) -> Heartbeat:
        """Starts the heartbeat writer; returns once its first row is on the primary."""
        self.stop_heartbeat()
        self.heartbeat = Heartbeat(self.primary_port, self.dir / "heartbeat.log", interval)
        self.heartbeat.start()
        hb = self.heartbeat
        _wait(lambda: hb.error is None and self.sql(
            "primary", "SELECT COUNT(*) FROM meta.heartbeat WHERE server_id = 1") == [["1"]],
              10, "the first heartbeat", hb.log)
        return hb

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def heartbeat_lag(self, which: str = "replica") -> Optional[float]:
        """Seconds between `which`'s clock and its heartbeat row (None: no row yet)."""
        rows = self.sql(which, HEARTBEAT_LAG)
        return float(rows[0][0]) if rows and rows[0][0] != "NULL" else None


# ---- PostgreSQL ----

class PostgresPair:
    """A PostgreSQL 15 primary and one streaming replica made with `pg_basebackup -R`
    (standby.signal + primary_conninfo), hot standby, trust authentication (replication
    included) from 127.0.0.1, fsync off. Run as `postgres` when the test runs as root: the data
    directories live in a directory of their own under /tmp (pytest's are private to root),
    removed by stop(); the logs go to workdir/postgres."""

    def __init__(self, workdir: Path):
        self.dir = Path(workdir) / "postgres"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.primary_port, self.replica_port = free_port(), free_port()
        root = os.geteuid() == 0
        self.user = "postgres" if root else pwd.getpwuid(os.geteuid()).pw_name
        self._run_as = "postgres" if root else None
        self.data_root: Optional[Path] = None
        self.servers: Dict[str, Server] = {}

    def _port(self, which: str) -> int:
        assert which in ("primary", "replica"), which
        return self.primary_port if which == "primary" else self.replica_port

    def _server(self, which: str) -> Server:
        data = self.data_root / which
        # The same limits on both: a hot standby refuses to run with fewer connections, WAL
        # senders... than its primary. The replica reports its positions every second.
        args = [str(PG_BIN / "postgres"), "-D", str(data), "-p", str(self._port(which)),
                "-c", f"listen_addresses={LOOPBACK}",
                "-c", f"unix_socket_directories={self.data_root}",
                "-c", "fsync=off", "-c", "wal_level=replica", "-c", "hot_standby=on",
                "-c", "max_wal_senders=5", "-c", "max_connections=40",
                "-c", "shared_buffers=16MB", "-c", "wal_receiver_status_interval=1s"]
        return Server(f"postgres {which}", args, self.dir / f"{which}.log",
                      user=self._run_as, stop_signal=signal.SIGINT)

    def _ready(self, which: str) -> bool:
        try:
            r = subprocess.run([str(PG_BIN / "pg_isready"), "-h", LOOPBACK,
                                "-p", str(self._port(which)), "-t", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0

    def _tool(self, args: Sequence[str], log: Path, what: str) -> None:
        p = spawn(args, log, user=self._run_as)
        if p.wait(120) != 0:
            raise _fail(f"{what} failed", log)

    def start(self, timeout: float = 60.0) -> None:
        """initdb, the primary, pg_basebackup -R, the replica; returns once the primary's
        pg_stat_replication shows it streaming."""
        deadline = time.monotonic() + timeout
        self.data_root = Path(tempfile.mkdtemp(prefix="sluice-pgpair-"))
        if self._run_as:
            pw = pwd.getpwnam(self._run_as)
            os.chmod(self.data_root, 0o755)
            os.chown(self.data_root, pw.pw_uid, pw.pw_gid)
        primary_data = self.data_root / "primary"
        self._tool([str(PG_BIN / "initdb"), "-D", str(primary_data), "-U", self.user,
                    "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"],
                   self.dir / "initdb.log", "initdb")
        with open(primary_data / "pg_hba.conf", "a") as hba:
            hba.write(f"host replication all {LOOPBACK}/32 trust\n")
        primary = self.servers["primary"] = self._server("primary")
        primary.start(lambda: self._ready("primary"), deadline - time.monotonic())
        self._tool([str(PG_BIN / "pg_basebackup"), "-h", LOOPBACK, "-p", str(self.primary_port),
                    "-U", self.user, "-D", str(self.data_root / "replica"), "-R",
                    "-X", "stream", "-c", "fast"],
                   self.dir / "basebackup.log", "pg_basebackup")
        replica = self.servers["replica"] = self._server("replica")
        replica.start(lambda: self._ready("replica"), max(1.0, deadline - time.monotonic()))
        _wait(lambda: self.query("primary", "SELECT state FROM pg_stat_replication")
              == [["streaming"]], max(1.0, deadline - time.monotonic()),
              "the replica to stream", replica.log, primary.log)
        # A first commit replayed: until then pg_last_xact_replay_timestamp() is NULL.
        self.query("primary", "CREATE TABLE load_rows (id bigserial PRIMARY KEY, pad text)")
        self.wait_replica_caught_up(max(1.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """SIGINT (fast shutdown), the replica first; SIGKILL to what remains after 20 s. A server
        already dead or never started is skipped. Removes the data directories."""
        _stop_pair(self.servers)
        if self.data_root is not None:
            shutil.rmtree(self.data_root, ignore_errors=True)
            self.data_root = None

    def query(self, which: str, sql: str) -> List[List[str]]:
        """Rows of `sql` on "primary" or "replica", run with psql (text; NULL as "", so a
        statement without rows gives [] and one NULL gives [[""]])."""
        r = subprocess.run([str(PG_BIN / "psql"), "-h", LOOPBACK, "-p", str(self._port(which)),
                            "-U", self.user, "-d", "postgres", "-X", "-q", "-A", "-t", "-F", "\t",
                            "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise AssertionError(f"psql ({which}): {sql}: {r.stderr.strip()}")
        return [line.split("\t") for line in r.stdout.splitlines()]

    def conninfo(self, which: str) -> str:
        return (f"host={LOOPBACK} port={self._port(which)} user={self.user} dbname=postgres "
                f"connect_timeout=2")

    def pause_replay(self) -> None:
        """Pauses WAL replay on the replica (WAL still arrives); returns once it is paused."""
        self.query("replica", "SELECT pg_wal_replay_pause()")
        _wait(lambda: self.query("replica", "SELECT pg_get_wal_replay_pause_state()")
              == [["paused"]], 10, "replay to pause", self.servers["replica"].log)

    def resume_replay(self) -> None:
        self.query("replica", "SELECT pg_wal_replay_resume()")

    def write_load(self, rows: int) -> None:
        """Inserts `rows` rows (200 bytes each) into load_rows on the primary, one
        transaction."""
        self.query("primary", "INSERT INTO load_rows (pad) SELECT repeat('x', 200) "
                              f"FROM generate_series(1, {int(rows)})")

    def kill_replica(self) -> None:
        """SIGKILL to the replica's postmaster and its processes; waits until all are gone."""
        replica = self.servers.get("replica")
        if replica is not None:
            replica.kill()

    def wait_replica_caught_up(self, timeout: float = 10.0) -> None:
        """Waits until the replica has replayed the primary's WAL up to the primary's current
        LSN when called."""
        target = self.query("primary", "SELECT pg_current_wal_lsn()")[0][0]
        _wait(lambda: self.query("replica", f"SELECT pg_last_wal_replay_lsn() >= '{target}'")
              == [["t"]], timeout, f"the replica to replay up to {target}",
              self.servers["replica"].log)


# ---- Redis ----

class RedisPair:
    """A Redis primary and one replica (--replicaof) on 127.0.0.1, no persistence, protected
    mode off; the replica's initial sync starts at once (diskless, no delay)."""

    def __init__(self, workdir: Path):
        self.dir = Path(workdir) / "redis"
        self.primary_port, self.replica_port = free_port(), free_port()
        self.servers: Dict[str, Server] = {}

    def _port(self, which: str) -> int:
        assert which in ("primary", "replica"), which
        return self.primary_port if which == "primary" else self.replica_port

    def _server(self, which: str, extra: Sequence[str]) -> Server:
        home = self.dir / which
        home.mkdir(parents=True, exist_ok=True)
        args = ["redis-server", "--port", str(self._port(which)), "--bind", LOOPBACK,
                "--save", "", "--appendonly", "no", "--dir", str(home), "--daemonize", "no",
                "--protected-mode", "no", "--repl-diskless-sync-delay", "0", *extra]
        return Server(f"redis {which}", args, home / "server.log")

    def _ready(self, which: str) -> bool:
        try:
            r = subprocess.run(["redis-cli", "-h", LOOPBACK, "-p", str(self._port(which)),
                                "PING"], capture_output=True, text=True, timeout=2,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:  # redis-cli has no connect timeout of its own
            return False
        return r.returncode == 0 and r.stdout.strip() == "PONG"

    def start(self, timeout: float = 30.0) -> None:
        """Starts both; returns once the replica's link to the primary is up."""
        deadline = time.monotonic() + timeout
        self.servers["primary"] = self._server("primary", [])
        self.servers["primary"].start(lambda: self._ready("primary"), timeout)
        self.servers["replica"] = self._server(
            "replica", ["--replicaof", LOOPBACK, str(self.primary_port)])
        self.servers["replica"].start(lambda: self._ready("replica"),
                                      max(1.0, deadline - time.monotonic()))
        self.wait_replica_linked(max(1.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """SIGTERM, the replica first; SIGKILL after 20 s. A server already dead is skipped."""
        _stop_pair(self.servers)

    def cli(self, which: str, *args: str) -> str:
        """One redis-cli command on "primary" or "replica"; its output, stripped."""
        r = subprocess.run(["redis-cli", "-h", LOOPBACK, "-p", str(self._port(which)), *args],
                           capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise AssertionError(f"redis-cli ({which}) {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout.strip()

    def wait_replica_linked(self, timeout: float = 10.0) -> None:
        """Waits until the replica's INFO replication says master_link_status:up."""
        _wait(lambda: "master_link_status:up" in self.cli("replica", "INFO", "replication"),
              timeout, "the replica's link to the primary", self.servers["replica"].log,
              self.servers["primary"].log)

    def kill_replica(self) -> None:
        """SIGKILL to the replica; waits until it is gone."""
        replica = self.servers.get("replica")
        if replica is not None:
            replica.kill()
