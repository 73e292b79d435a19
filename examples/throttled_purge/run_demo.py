#!/usr/bin/python3
"""A chunked purge of a big table, run twice on a MariaDB primary + replica: once asking
sluice's throttler before every chunk, once without. Prints (and with --out writes) how long
each run took and how far the replica fell behind.

The replica's lag is not staged: nothing stops or slows the replica. The purged table has no
primary key and no index, and replication is row-based. The primary deletes a chunk with ONE
table scan (`DELETE ... WHERE created < cutoff LIMIT 100`: the expired rows are the oldest, at
the table's front). The replica gets the chunk as 100 row events and, with no key to look a row
up by, starts a table scan from the table's first record for each of them: 100 scans for the
primary's one, each stepping over the delete-marked records the chunks before left at the front
(until InnoDB's purge removes them). So the replica is about twice as slow as the primary at the
same purge, and falls further behind for as long as the purge runs. `--key primary` and
`--key index` are the controls: the same purge on a table with a primary key, or with just an
index on `created`; the replica looks rows up through the key, and keeps up.

    /usr/bin/python3 examples/throttled_purge/run_demo.py              # the full demo
    /usr/bin/python3 examples/throttled_purge/run_demo.py --quick      # the CI smoke test

Every server (mariadbd primary and replica, `sluice serve`) listens on 127.0.0.1 only, runs in a
fresh directory under /tmp and is stopped by its pid at the end, also on an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
# The generated gRPC stubs and the client package (a PYTHONPATH set by the caller comes first),
# and tests/throttler_db/servers.py for the MariaDB pair.
for _p in (ROOT / "build" / "dev" / "clients" / "python" / "gen", ROOT / "clients" / "python",
           ROOT / "tests" / "throttler_db"):
    if str(_p) not in sys.path:
        sys.path.append(str(_p))

import servers  # noqa: E402
from servers import MariaDBPair  # noqa: E402
from sluice_client import Backoff, ChunkStats, ThrottlerClient, run_in_chunks  # noqa: E402

LOOPBACK = "127.0.0.1"
CHUNK = 100                 # rows per DELETE
THRESHOLD = 1.0             # seconds of replica lag: the throttler's threshold
SAMPLE_EVERY = 0.1          # seconds between the demo's own lag samples
KEEP = 0.1                  # the newest tenth of the table is not expired: the purge keeps it
FULL_ROWS = 60_000
QUICK_ROWS = 25_000
BODY_BYTES = 1_000          # each row's body (an event's JSON document, more or less)
BASE_TIME = "2024-01-01 00:00:00"
# --key: what app.events is indexed by (the demo's table has neither; the others are controls).
KEYS = {"none": "", "primary": ", PRIMARY KEY (id)", "index": ", KEY created (created)"}
KEY_TEXT = {
    "none": "no primary key and no index: the replica finds each deleted row with a table scan",
    "primary": "a primary key (a control run): the replica finds each row through it",
    "index": "no primary key but an index on `created` (a control run): the primary deletes "
             "through it, and the replica finds each row through it too",
}

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    """In the child before exec: a session of its own, SIGKILL when the demo dies."""
    os.setsid()
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- sluice serve ----

class Sluice:
    """One `sluice serve` with the throttler config, on free loopback ports."""

    def __init__(self, binary: Path, workdir: Path, config: str):
        self.binary = binary
        self.config = workdir / "throttler.yaml"
        self.config.write_text(config)
        self.log_path = workdir / "sluice.log"
        self.proc: Optional[subprocess.Popen] = None
        self.http_port = 0

    @staticmethod
    def _free_port() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, 0))
            return s.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    def start(self, timeout: float = 20.0) -> None:
        for _attempt in range(3):  # a port found free may be taken before the server binds it
            grpc_port, self.http_port = self._free_port(), self._free_port()
            with open(self.log_path, "ab") as out:
                self.proc = subprocess.Popen(
                    [str(self.binary), "serve", "--grpc", f"{LOOPBACK}:{grpc_port}",
                     "--http", f"{LOOPBACK}:{self.http_port}", "--config", str(self.config)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, close_fds=True,
                    preexec_fn=_die_with_parent)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self._healthy():
                    return
                time.sleep(0.05)
            self.stop()
            if "cannot listen" not in self.log_path.read_text(errors="replace"):
                break
        raise RuntimeError(f"sluice serve did not start; its log:\n"
                           f"{self.log_path.read_text(errors='replace')[-3000:]}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def check(self) -> Tuple[int, dict]:
        """One check as the job's app: (HTTP status, body); (0, {}) when it cannot be asked."""
        try:
            with urllib.request.urlopen(self.url + "/throttler/check?app=purge", timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
        except (OSError, ValueError):
            return 0, {}

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# ---- the purge job ----

class Purger:
    """The purge job's connection: ONE `mariadb` client on the primary, fed through its stdin
    for the whole run. chunk() sends one DELETE of at most 100 expired rows, then a SELECT of a
    marker with ROW_COUNT(), and reads the client's output until the marker shows: the chunk has
    committed (autocommit) and how many rows it deleted."""

    def __init__(self, port: int, log_path: Path, cutoff: str, timeout: float = 120.0):
        self.cutoff, self.timeout = cutoff, timeout
        self._err = open(log_path, "ab")
        self.proc = subprocess.Popen(
            ["mariadb", "--no-defaults", "--protocol=TCP", "-h", LOOPBACK, "-P", str(port),
             "-u", "root", "--batch", "--skip-column-names", "--unbuffered",
             "--connect-timeout=5", "app"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, close_fds=True,
            preexec_fn=_die_with_parent)
        self._buf = b""
        self.chunks = 0
        self.rows = 0

    def chunk(self) -> bool:
        """Deletes up to CHUNK of the oldest expired rows; True while a chunk came back full
        (more may remain)."""
        self.chunks += 1
        marker = f"chunk-{self.chunks}-done"
        self.proc.stdin.write(
            f"DELETE FROM events WHERE created < '{self.cutoff}' LIMIT {CHUNK};\n"
            f"SELECT '{marker}', ROW_COUNT();\n".encode())
        self.proc.stdin.flush()
        line = self._line_starting(marker)
        deleted = int(line.split("\t")[1])
        self.rows += deleted
        return deleted == CHUNK

    def _line_starting(self, prefix: str) -> str:
        deadline = time.monotonic() + self.timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith(prefix):
                    return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the purge's mariadb client: no {prefix!r} within "
                                   f"{self.timeout} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    raise RuntimeError(f"the purge's mariadb client exited "
                                       f"({self.proc.wait()}); see {self._err.name}")
                self._buf += data

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self.proc.stdout.close()
        self._err.close()


# ---- watching the replica ----

class LagSampler:
    """Samples the replica's heartbeat lag (MariaDBPair.heartbeat_lag) every SAMPLE_EVERY
    seconds from a background thread; samples are (seconds since start, lag or None)."""

    def __init__(self, pair: MariaDBPair):
        self.pair = pair
        self.samples: List[Tuple[float, Optional[float]]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> "LagSampler":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                lag = self.pair.heartbeat_lag("replica")
            except Exception:  # noqa: BLE001  (a sample lost to a busy machine is no failure)
                lag = None
                self.errors += 1
            self.samples.append((time.monotonic() - self.t0, lag))
            next_at = max(next_at + SAMPLE_EVERY, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def max_lag(self) -> float:
        return max((lag for _, lag in self.samples if lag is not None), default=float("nan"))

    def seconds_over(self, threshold: float) -> float:
        return sum(SAMPLE_EVERY for _, lag in self.samples if lag is not None and lag > threshold)


# ---- the demo ----

@dataclass
class RunResult:
    name: str
    rows: int
    stats: ChunkStats
    wall: float                 # the purge job, first chunk to last
    caught_up: float            # until the replica had applied all of it
    max_lag: float              # the demo's samples, from the first chunk until caught up
    over: float                 # seconds of samples over the threshold
    samples: int
    lag_trace: List[Tuple[float, Optional[float]]] = field(default_factory=list)
    reasons: Dict[str, int] = field(default_factory=dict)   # refusals by the body's reason


class Demo:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args = args
        self.workdir = workdir
        self.pair: Optional[MariaDBPair] = None
        self.sluice: Optional[Sluice] = None
        self.purger: Optional[Purger] = None
        self.sampler: Optional[LagSampler] = None
        self.pids: List[int] = []
        expired = args.rows - int(args.rows * KEEP)
        self.expired = expired
        # Row i (1..rows) was created BASE_TIME + i minutes: rows 1..expired are older.
        self.cutoff = (datetime.fromisoformat(BASE_TIME)
                       + timedelta(minutes=expired + 1)).strftime("%Y-%m-%d %H:%M:%S")

    # -- setup --

    def start_mariadb(self) -> None:
        self.pair = MariaDBPair(self.workdir / "db")
        self.pair.start(timeout=120)
        self.pids += [s.proc.pid for s in self.pair.servers.values()]
        self.pair.start_heartbeat(interval=0.1)
        self.pids.append(self.pair.heartbeat.proc.pid)
        self.pair.sql("primary", "CREATE DATABASE app")

    def start_sluice(self) -> None:
        config = f"""policies:
  db:
    kind: throttler
    shard: main
    fast_interval: 100ms
    metrics:
      lag:
        probe: mysql_heartbeat
        hosts: [{LOOPBACK}:{self.pair.replica_port}]
        user: {MariaDBPair.THROTTLER_USER}
        password: {MariaDBPair.THROTTLER_PASSWORD}
        heartbeat_table: meta.heartbeat
        threshold: {THRESHOLD:g}        # seconds
"""
        self.sluice = Sluice(self.args.sluice, self.workdir, config)
        self.sluice.start()
        self.pids.append(self.sluice.proc.pid)

    def fill(self) -> None:
        """(Re)creates app.events -- no primary key, no index (unless --key) -- with args.rows
        rows, oldest first, and waits until the replica has them and its lag is back near
        zero."""
        n = self.args.rows
        stmts = ["DROP TABLE IF EXISTS app.events",
                 "CREATE TABLE app.events (id bigint unsigned NOT NULL, account_id int unsigned "
                 "NOT NULL, created datetime NOT NULL, body varchar(4000) NOT NULL"
                 + KEYS[self.args.key] + ") ENGINE=InnoDB"]
        step = 2000
        for lo in range(1, n + 1, step):
            hi = min(n, lo + step - 1)
            stmts.append(
                f"INSERT INTO app.events SELECT seq, seq % 997, '{BASE_TIME}' + INTERVAL seq "
                f"MINUTE, CONCAT('{{\"event\":', seq, ',\"data\":\"', "
                f"REPEAT('x', {self.args.body_bytes}), '\"}}') FROM meta.seq_{lo}_to_{hi}")
        t = time.monotonic()
        self.pair.sql("primary", ";\n".join(stmts))
        self.pair.wait_replica_caught_up(timeout=300)
        deadline = time.monotonic() + 60
        while (self.pair.heartbeat_lag("replica") or 0) > 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # let both servers' background work (InnoDB purge, flushing) settle
        log(f"filled app.events with {n} rows ({time.monotonic() - t:.1f} s)")

    def wait_throttler_open(self, timeout: float = 30) -> None:
        """Waits until the throttler has answered 200 for a second on end. Checking also wakes
        it: with no check for a while (the run without it) its probe samples only every 5 s."""
        deadline = time.monotonic() + timeout
        open_since: Optional[float] = None
        while True:
            status, body = self.sluice.check()
            now = time.monotonic()
            if status != 200:
                open_since = None
            elif open_since is None:
                open_since = now
            elif now - open_since >= 1.0:
                return
            if now > deadline:
                raise RuntimeError(f"the throttler did not answer 200 within {timeout} s: "
                                   f"{status} {body}")
            time.sleep(0.1)

    # -- the two runs --

    def run(self, name: str, throttled: bool) -> RunResult:
        self.fill()
        if throttled:
            self.wait_throttler_open()
        self.purger = Purger(self.pair.primary_port, self.workdir / f"purge-{name}.log",
                             self.cutoff)
        self.pids.append(self.purger.proc.pid)
        self.sampler = LagSampler(self.pair).start()
        log(f"run '{name}': purging {self.expired} expired rows, {CHUNK} per chunk")
        t0 = time.monotonic()
        reasons: Dict[str, int] = {}
        if throttled:
            def on_wait(result, delay: float) -> None:
                reasons[result.reason] = reasons.get(result.reason, 0) + 1
                if self.args.verbose:
                    log(f"  held back: {result.reason}, lag {result.value} s; next check in "
                        f"{delay:.2f} s")
            with ThrottlerClient(self.sluice.url, app="purge", shard="main") as client:
                stats = run_in_chunks(client, self.purger.chunk, deadline_per_chunk=120,
                                      backoff=Backoff(initial=1.0, cap=4.0, min_interval=0.1),
                                      on_wait=on_wait)
        else:
            stats = ChunkStats()
            while True:
                stats.chunks += 1
                if not self.purger.chunk():
                    break
        wall = time.monotonic() - t0
        self.purger.close()
        self.purger = None
        self.pair.wait_replica_caught_up(timeout=300)
        caught_up = time.monotonic() - t0
        time.sleep(3 * SAMPLE_EVERY)  # a last few samples after catching up
        self.sampler.stop()
        s, self.sampler = self.sampler, None
        if self.pair.heartbeat.error:
            raise RuntimeError(f"the heartbeat writer stopped: {self.pair.heartbeat.error}")
        result = RunResult(name, self.expired, stats, wall, caught_up, s.max_lag,
                           s.seconds_over(THRESHOLD), len(s.samples), s.samples, reasons)
        log(f"run '{name}': {stats.chunks} chunks in {wall:.1f} s, replica caught up after "
            f"{caught_up:.1f} s, max lag {s.max_lag:.2f} s ({len(s.samples)} samples"
            f"{f', {s.errors} failed' if s.errors else ''})")
        return result

    # -- teardown --

    def stop(self) -> None:
        """Stops everything started, by pid (each step runs even if one before failed)."""
        for step in (lambda: self.sampler and self.sampler.stop(),
                     lambda: self.purger and self.purger.close(),
                     lambda: self.sluice and self.sluice.stop(),
                     lambda: self.pair and self.pair.stop()):
            try:
                step()
            except Exception as e:  # noqa: BLE001
                log(f"while stopping: {type(e).__name__}: {e}")

    def _naming_workdir(self) -> List[str]:
        r = subprocess.run(["pgrep", "-a", "-f", str(self.workdir)], capture_output=True,
                           text=True)
        return [line for line in r.stdout.splitlines() if line.strip()]

    def kill_strays(self) -> None:
        """What stop() cannot reach by a server object -- a mariadb-install-db interrupted
        midway, its bootstrap server -- still names the work directory (a fresh mkdtemp, so
        only the demo's processes do): SIGKILL to those pids, our own children reaped."""
        for _ in range(50):
            pids = [int(line.split()[0]) for line in self._naming_workdir()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
            for pid in pids:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass  # not our child: init reaps it

    def leftovers(self) -> List[str]:
        """Processes still alive that the demo started: its own pids, and anything `pgrep -f`
        finds naming its directory (the servers' --datadir, sluice's --config)."""
        alive = []
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    alive.append(f"pid {pid}")
            except FileNotFoundError:
                pass
        return alive + self._naming_workdir()


# ---- the report ----

def table(results: List[RunResult]) -> str:
    lines = ["| run | rows | chunks | checks | waits | waited (s) | wall (s) "
             "| max replica lag (s) | replica caught up (s) | lag > 1 s (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.name} | {r.rows} | {r.stats.chunks} | {r.stats.checks} | "
                     f"{r.stats.refusals} | {r.stats.waited_seconds:.1f} | {r.wall:.1f} | "
                     f"{r.max_lag:.2f} | {r.caught_up:.1f} | {r.over:.1f} |")
    return "\n".join(lines)


def lag_profile(r: RunResult, step: float = 2.0) -> str:
    """The max lag in each `step`-second window, as one line."""
    out, window, worst = [], 0.0, None
    for t, lag in r.lag_trace:
        while t >= window + step:
            out.append("-" if worst is None else f"{worst:.1f}")
            window, worst = window + step, None
        if lag is not None:
            worst = lag if worst is None else max(worst, lag)
    out.append("-" if worst is None else f"{worst:.1f}")
    return " ".join(out)


def report(args: argparse.Namespace, results: List[RunResult], elapsed: float,
           command: str) -> str:
    free, held = results
    key = KEY_TEXT[args.key]
    seen = held.stats.max_value_seen
    lines = [
        table(results),
        "",
        f"- table `app.events`: {args.rows} rows of about {args.body_bytes + 30} bytes, {key}",
        f"- purge: the {free.rows} rows older than the cutoff (the oldest "
        f"{100 - round(KEEP * 100)} %), `DELETE FROM events WHERE created < cutoff LIMIT "
        f"{CHUNK}` per chunk, autocommit, through one persistent `mariadb` client on the primary",
        f"- replication: MariaDB GTID replica, binlog_format=ROW, one SQL thread; pt-heartbeat-"
        f"style heartbeat written on the primary every 100 ms",
        f"- throttler: `mysql_heartbeat` on the replica, threshold {THRESHOLD:g} s, sampled every "
        f"100 ms; the job checks `GET /throttler/check?app=purge` before each chunk "
        f"(`run_in_chunks`, `Backoff(initial=1.0, cap=4.0, min_interval=0.1)`); the largest lag "
        f"it reported to the job: {'-' if seen is None else f'{seen:.2f}'} s; the waits' "
        f"reasons: {', '.join(f'{k} x{v}' for k, v in held.reasons.items()) or '-'}",
        f"- max replica lag: the demo's own samples of the replica's heartbeat lag every "
        f"{SAMPLE_EVERY:g} s, from the first chunk until the replica had applied the last one "
        f"(`wall` is the job's time, `replica caught up` the replica's; `lag > 1 s` counts "
        f"sampled seconds over the threshold)",
        "- lag profile (the largest sample in each 2 s, from the first chunk):",
        *(f"  - {r.name}: {lag_profile(r)}" for r in results),
        f"- demo time {elapsed:.0f} s; load average at the end {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} CPUs",
        f"- command: `{command}`",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, help=f"table size (default {FULL_ROWS}; "
                                             f"--quick: {QUICK_ROWS})")
    ap.add_argument("--quick", action="store_true",
                    help="the CI smoke test: a smaller table, and exit 1 unless the replica "
                         "lagged over the threshold without the throttler and its max lag was "
                         "lower with it")
    ap.add_argument("--out", type=Path, help="also write the report (markdown) here")
    ap.add_argument("--body-bytes", type=int, default=BODY_BYTES,
                    help=f"bytes of each row's body (default {BODY_BYTES})")
    ap.add_argument("--sluice", type=Path,
                    default=Path(os.environ.get("SLUICE_BIN")
                                 or ROOT / "build" / "dev" / "apps" / "sluice" / "sluice"),
                    help="the sluice binary (default: $SLUICE_BIN or build/dev's)")
    ap.add_argument("--key", choices=sorted(KEYS), default="none",
                    help="the table's key: none (the demo), or a control run: primary (a primary "
                         "key) or index (a secondary index on `created`, no primary key); with "
                         "either the replica finds rows through the key and keeps up")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("-v", "--verbose", action="store_true", help="log each wait")
    args = ap.parse_args()
    if args.rows is None:
        args.rows = QUICK_ROWS if args.quick else FULL_ROWS
    if args.rows < 10 * CHUNK:
        ap.error(f"--rows: at least {10 * CHUNK}")
    if not 0 <= args.body_bytes <= 3900:
        ap.error("--body-bytes: 0 to 3900")
    if not os.access(args.sluice, os.X_OK):
        ap.error(f"no sluice binary at {args.sluice} (build it, or pass --sluice / SLUICE_BIN)")
    command = " ".join(["/usr/bin/python3", "examples/throttled_purge/run_demo.py",
                        *sys.argv[1:]])

    # SIGTERM (and SIGHUP) end the demo like Ctrl-C does: through the finally below.
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored

    workdir = Path(tempfile.mkdtemp(prefix="sluice-purge-demo-", dir="/tmp"))
    demo = Demo(args, workdir)
    started = time.monotonic()
    results: List[RunResult] = []
    code = 0
    finished = False
    try:
        log(f"work directory {workdir}")
        demo.start_mariadb()
        log(f"mariadb primary 127.0.0.1:{demo.pair.primary_port}, replica "
            f"127.0.0.1:{demo.pair.replica_port} (GTID, binlog_format=ROW)")
        demo.start_sluice()
        log(f"sluice serve: {demo.sluice.url} (throttler: heartbeat lag <= {THRESHOLD:g} s)")
        results.append(demo.run("without throttler", throttled=False))
        results.append(demo.run("with throttler", throttled=True))
        finished = True
    except KeyboardInterrupt as e:
        log(f"interrupted ({str(e) or 'Ctrl-C'}): stopping")
        code = 130
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        demo.stop()
        demo.kill_strays()
        left = demo.leftovers()
        if left:
            log("LEFT RUNNING: " + "; ".join(left))
            code = code or 3
        else:
            log("stopped: no process of the demo left (pids checked, pgrep -f "
                f"{workdir}: none)")
        if args.keep or code or not finished:
            log(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if len(results) < 2:
        return code or 1

    text = report(args, results, time.monotonic() - started, command)
    print()
    print(text)
    if args.out:
        args.out.write_text(text)
    free, held = results
    if args.key != "none":
        log(f"a control run (--key {args.key}): no verdict")
        return code
    lower = held.max_lag < free.max_lag
    facts = [(lower, f"the replica's max lag with the throttler ({held.max_lag:.2f} s) is lower "
                     f"than without it ({free.max_lag:.2f} s)")]
    if args.quick:
        # The premise too: a run whose replica never lagged shows nothing, whatever the rest.
        facts[:0] = [(free.max_lag > THRESHOLD,
                      f"without the throttler the replica's lag went over the threshold "
                      f"({free.max_lag:.2f} s > {THRESHOLD:g} s)"),
                     (held.stats.refusals >= 1 or lower,
                      f"the run with the throttler waited ({held.stats.refusals} times, "
                      f"{held.stats.waited_seconds:.1f} s) or kept the max lag lower")]
    elif free.max_lag <= THRESHOLD:
        log(f"note: without the throttler the lag stayed under the threshold "
            f"({free.max_lag:.2f} s): too small a table (--rows) to show anything")
    for ok, what in facts:
        log(("ok: " if ok else "FAIL: ") + what)
    if not all(ok for ok, _ in facts):
        code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
