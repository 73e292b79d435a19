"""The fault suite's harness: real coordinators, real `sluice serve` nodes, a load generator
that knows exactly how many calls run in the backend, and a sampler that checks the fleet's
bound at every sample.

Every process started here dies with the test process (the kernel's parent-death signal, set by
setpriv after subprocess has changed the user, so it also holds for PostgreSQL, which runs as
`postgres`; a change of user clears it) and is stopped by its pid at the end. No Python code runs
between fork and exec (child_options()).
"""

from __future__ import annotations

import heapq
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import sluice_client

PG_BIN = Path("/usr/lib/postgresql/15/bin")
# Runs a command with the parent-death signal set (util-linux), then execs it in place (same pid).
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"


_HANDED_OUT: set = set()


def free_port() -> int:
    """A loopback port nobody listens on now, and one this suite has not handed out before: the
    kernel may give the same free port twice to two nodes that are launched together, before
    either has bound it."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def port_accepts(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.02,
               what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def child_options(user: Optional[str] = None, new_session: bool = True) -> Dict[str, object]:
    """What a child of this suite starts with, set by subprocess itself between fork and exec: a
    new session (so a signal can reach a server and all its workers) and the user (when root).
    No Python runs in the child: this process has threads (gRPC's, the load's), and a child
    forked from it that runs Python code may wait forever on a lock another thread held at the
    fork (CPython also runs the fork handlers gRPC registers, only for a preexec_fn)."""
    options: Dict[str, object] = {"start_new_session": new_session, "close_fds": True}
    pw = pwd.getpwnam(user) if user and os.geteuid() == 0 else None
    if pw is not None:
        options.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    return options


def die_with_parent(args: Sequence[str]) -> List[str]:
    """`args` run so that they are killed when this process dies: setpriv sets the parent-death
    signal (after the user change, which would clear it) and execs them in place."""
    return [SETPRIV, "--pdeathsig", "KILL", "--", *args]


def spawn(args: Sequence[str], log: Path, user: Optional[str] = None,
          env: Optional[Dict[str, str]] = None, new_session: bool = True) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(die_with_parent(args), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out, env=env, **child_options(user, new_session))


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except FileNotFoundError:
        return ""


class Coordinator:
    """A coordinator server the test owns: started, stopped, killed and restarted on the same
    port and data directory."""

    kind = ""

    def __init__(self, workdir: Path, extra_hosts: Sequence[str] = ()):
        self.dir = workdir / self.kind
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hosts = ["127.0.0.1", *extra_hosts]
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.log = self.dir / "server.log"

    def _args(self) -> List[str]:
        raise NotImplementedError

    def _user(self) -> Optional[str]:
        return None

    def start(self, timeout: float = 30.0) -> None:
        self.proc = spawn(self._args(), self.log, user=self._user())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.kind} exited at start:\n{tail(self.log)}")
            if self.ready():
                return
            time.sleep(0.02)
        raise AssertionError(f"{self.kind} did not start:\n{tail(self.log)}")

    def ready(self) -> bool:
        return port_accepts("127.0.0.1", self.port)

    def keeps_state(self) -> bool:
        """Whether what it committed survives a SIGKILL and restart."""
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        """Signals the server and every process it started (PostgreSQL's backends, each in a
        session of its own), the server first so that it starts no new one meanwhile."""
        assert self.proc is not None and self.proc.poll() is None, f"{self.kind} is not running"
        family = descendants(self.proc.pid)
        os.kill(self.proc.pid, sig)
        for pid in family:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        family = descendants(self.proc.pid)
        self.signal(signal.SIGKILL)
        self.proc.wait(10)
        # Wait for the workers too, so a restart on the same data directory finds no shared
        # memory still attached.
        wait_until(lambda: not any(_running(p) for p in family), 10,
                   what=f"{self.kind}'s processes to die")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.signal(signal.SIGCONT)
                self.proc.send_signal(self._stop_signal())
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            except ProcessLookupError:
                pass

    def _stop_signal(self) -> int:
        return signal.SIGTERM

    @property
    def label(self) -> str:
        """What the results call it."""
        return self.kind

    def config(self, host: str) -> str:
        """The coordinator's section in a node's config, reached at `host`."""
        raise NotImplementedError


def _stat(pid: int) -> Optional[List[str]]:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _running(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def descendants(root: int) -> List[int]:
    """Every live process below `root` (children, their children...)."""
    parents: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                parents[int(entry)] = int(st[1])
    out, frontier = [], {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier}
        out.extend(frontier)
    return out


class RedisCoordinator(Coordinator):
    """A Redis of the test's own. `persistence`:

    - "none" (the default): no persistence, so a restart after SIGKILL comes back empty (the
      fleet's state is lost, the harder case for the nodes);
    - "rdb": snapshots only when the test asks for one (SAVE; no save points), into dump.rdb in
      its directory, which a restart loads;
    - "aof": an append-only file (appendonlydir/, appendfsync everysec), which a restart loads.

    `replica_of`: the port (on 127.0.0.1) of a primary it replicates."""

    kind = "redis"

    def __init__(self, workdir: Path, extra_hosts: Sequence[str] = (), persistence: str = "none",
                 replica_of: Optional[int] = None):
        assert persistence in ("none", "rdb", "aof"), persistence
        self.persistence, self.replica_of = persistence, replica_of
        super().__init__(workdir, extra_hosts)

    def _args(self) -> List[str]:
        args = ["redis-server", "--port", str(self.port), "--bind", " ".join(self.hosts),
                "--save", "", "--appendonly", "yes" if self.persistence == "aof" else "no",
                "--dir", str(self.dir), "--daemonize", "no", "--protected-mode", "no"]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        return args

    def ready(self) -> bool:
        # Redis accepts connections while it loads its RDB or AOF, and answers LOADING to
        # commands until it is done: ready once INFO (served while loading) says it is not.
        if not port_accepts("127.0.0.1", self.port):
            return False
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "INFO",
                            "persistence"], capture_output=True, text=True, timeout=5)
        return r.returncode == 0 and "loading:0" in r.stdout.split()

    @property
    def label(self) -> str:
        return {"none": "redis", "rdb": "redis, RDB", "aof": "redis, AOF"}[self.persistence]

    def keeps_state(self) -> bool:
        # An AOF is written to the OS before a reply leaves (appendfsync everysec only delays
        # its fsync), so a process killed keeps it; a snapshot has only what it had when taken.
        return self.persistence == "aof"

    def incr_aof(self) -> Path:
        """The append-only file the server writes now (Redis 7: appendonlydir/*.incr.aof)."""
        files = sorted((self.dir / "appendonlydir").glob("*.incr.aof"))
        assert len(files) == 1, f"not one incremental AOF: {files}"
        return files[0]

    def config(self, host: str, port: Optional[int] = None) -> str:
        """`port`: the one the nodes are told (default: the server's own)."""
        return (f"    kind: redis\n    address: {host}:{port or self.port}\n"
                f"    connect_timeout: 200ms\n    acknowledged_handoff: true\n")


class PostgresCoordinator(Coordinator):
    """A PostgreSQL of the test's own. fsync is off (what is written reaches the disk when the
    OS writes it back), which a process crash does not lose: a SIGKILL of every server process
    keeps what was committed, as long as a commit waits for its WAL to be written
    (`synchronous_commit` on, as the federation suite runs it). With it off (the default here,
    as the fleet suite runs it), a commit is acknowledged before its WAL leaves the server's
    memory, and a SIGKILL loses the commits of up to three times wal_writer_delay (200 ms)
    before it, with nothing to tell that they are gone."""

    kind = "postgres"

    def __init__(self, workdir: Path, extra_hosts: Sequence[str] = (),
                 synchronous_commit: str = "off", durable_commits: bool = False,
                 standby_of: Optional["PostgresCoordinator"] = None,
                 upstream_port: Optional[int] = None):
        # durable_commits: the client sets synchronous_commit on for its own transactions (the
        # federation coordinator does), so what it commits survives whatever the server's
        # setting.
        # standby_of: an asynchronous standby of that server instead of a new cluster (a base
        # backup of it, pg_basebackup -R, streaming replication), reaching it at upstream_port
        # (default: its port; a TcpForwarder's, to cut the link).
        self.synchronous_commit = synchronous_commit
        self.durable_commits = durable_commits
        # Its own directory under /tmp: pytest's are private to root, and the server runs as
        # `postgres` when the test runs as root.
        super().__init__(Path(tempfile.mkdtemp(prefix="sluice-faults-")), extra_hosts)
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.data = self.dir / "data"
        self.upstream_port: Optional[int] = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chmod(self.dir.parent, 0o755)
            os.chmod(self.dir, 0o755)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        if standby_of is not None:
            self.upstream_port = upstream_port or standby_of.port
            backuplog = self.dir / "basebackup.log"
            p = spawn([str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                       str(standby_of.port), "-U", self.user, "-D", str(self.data), "-R",
                       "-X", "stream", "-c", "fast"], backuplog, user=self._user())
            if p.wait(120) != 0:
                raise AssertionError(f"pg_basebackup failed:\n{tail(backuplog)}")
            return
        initlog = self.dir / "initdb.log"
        p = spawn([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", self.user,
                   "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"], initlog,
                  user=self._user())
        if p.wait(120) != 0:
            raise AssertionError(f"initdb failed:\n{tail(initlog)}")
        # A node in the test's network namespace connects from the veth's address.
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write("host all all 10.213.0.0/16 trust\n")

    def _user(self) -> Optional[str]:
        return "postgres" if os.geteuid() == 0 else None

    def _args(self) -> List[str]:
        return [str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-c", f"listen_addresses={','.join(self.hosts)}",
                "-c", f"unix_socket_directories={self.dir}",
                "-c", "fsync=off", "-c", f"synchronous_commit={self.synchronous_commit}",
                "-c", "full_page_writes=off", "-c", "max_connections=50"] + (
                    # A standby streams from upstream_port (pg_basebackup -R wrote the rest).
                    ["-c", f"primary_conninfo=host=127.0.0.1 port={self.upstream_port} "
                           f"user={self.user} application_name=standby"]
                    if self.upstream_port is not None else [])

    def ready(self) -> bool:
        r = subprocess.run([str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port),
                            "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return r.returncode == 0

    def keeps_state(self) -> bool:
        return self.durable_commits or self.synchronous_commit != "off"

    def query(self, sql: str) -> List[List[str]]:
        """Rows of `sql` run with psql (text, one list of fields per row)."""
        r = subprocess.run([str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                            "-U", self.user, "-d", "postgres", "-X", "-A", "-t", "-F", "\t",
                            "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            raise AssertionError(f"psql: {sql}: {r.stderr.strip()}")
        return [line.split("\t") for line in r.stdout.splitlines() if line]

    def promote(self) -> None:
        """Ends a standby's recovery (pg_promote, waiting for it): a primary on a new timeline."""
        assert self.query("SELECT pg_promote(true, 30)") == [["t"]], "pg_promote failed"

    def streaming(self) -> bool:
        """Whether a standby's WAL receiver is streaming from its upstream."""
        return self.query("SELECT count(*) FROM pg_stat_wal_receiver "
                          "WHERE status = 'streaming'") == [["1"]]

    def _stop_signal(self) -> int:
        return signal.SIGINT  # fast shutdown

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.dir.parent, ignore_errors=True)

    def config(self, host: str) -> str:
        return (f"    kind: postgres\n    conninfo: \"host={host} port={self.port} "
                f"user={self.user} dbname=postgres connect_timeout=2\"\n"
                f"    acknowledged_handoff: true\n")


# ---- failover: an address that moves, and a replica that falls behind ----

class TcpForwarder:
    """A TCP forwarder on a free loopback port, thread-driven, relaying every connection it
    accepts to a port on 127.0.0.1 (`target`): an address that can move, as a virtual IP or a
    proxy in front of a primary does, or a link that can be cut.

    - move(port): closes every connection it relays (their clients see them drop, as when a
      virtual IP moves to another machine) and relays new ones to `port`; move(None) closes
      new ones at once (nothing behind the address).
    - hold(): relays nothing more; what either side sends is read and dropped and the
      connections stay open, so neither end notices (a link that stopped carrying data).
    A connection whose one side closes is closed on the other."""

    def __init__(self, target: Optional[int]):
        self.target = target
        self.held = False
        self._lock = threading.Lock()
        self._pairs: List[tuple] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        _HANDED_OUT.add(self.port)
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                target = self.target
            upstream = None
            if target is not None:
                try:
                    upstream = socket.create_connection(("127.0.0.1", target), timeout=1.0)
                    upstream.settimeout(None)
                except OSError:
                    upstream = None
            with self._lock:
                if upstream is None or self._stopped or self.target != target:
                    _close(client, upstream)
                    continue
                pair = (client, upstream)
                self._pairs.append(pair)
            for s in pair:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(pair, src, dst), daemon=True).start()

    def _pump(self, pair: tuple, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self.held:
                    dst.sendall(data)
        except OSError:
            pass
        self._drop(pair)

    def _drop(self, pair: tuple) -> None:
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
        _close(*pair)

    def hold(self) -> None:
        self.held = True

    def move(self, target: Optional[int]) -> None:
        with self._lock:
            self.target, self.held = target, False
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            _close(*pair)

    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.move(None)


def _close(*socks: Optional[socket.socket]) -> None:
    for s in socks:
        if s is None:
            continue
        try:
            s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv on it
        except OSError:
            pass
        s.close()


class Fronted:
    """A Redis the nodes reach through a TcpForwarder: their config names the forwarder."""

    kind = "redis"

    def __init__(self, redis: "RedisCoordinator", forwarder: TcpForwarder, label: str):
        self.redis, self.forwarder, self.label = redis, forwarder, label

    def config(self, host: str) -> str:
        return self.redis.config(host, port=self.forwarder.port)


class RedisSentinel(Coordinator):
    """A Redis Sentinel (redis-server in sentinel mode) monitoring the primary at
    127.0.0.1:`primary_port` as `master`: down after `down_after_ms` of silence; two
    sentinels agreeing start a failover."""

    kind = "sentinel"

    def __init__(self, workdir: Path, primary_port: int, master: str = "sluice",
                 down_after_ms: int = 500, failover_timeout_ms: int = 2000):
        self.primary_port, self.master = primary_port, master
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        super().__init__(workdir)

    def _args(self) -> List[str]:
        conf = self.dir / "sentinel.conf"  # a sentinel rewrites its own config
        m = self.master
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndaemonize no\ndir {self.dir}\n"
                        f"sentinel resolve-hostnames no\n"
                        f"sentinel monitor {m} 127.0.0.1 {self.primary_port} 2\n"
                        f"sentinel down-after-milliseconds {m} {self.down_after_ms}\n"
                        f"sentinel failover-timeout {m} {self.failover_timeout_ms}\n"
                        f"sentinel parallel-syncs {m} 1\n")
        return ["redis-server", str(conf), "--sentinel"]

    def keeps_state(self) -> bool:
        return False


class SentinelFailover:
    """A Redis primary and its replicas as the nodes see them: through the sentinels, by the
    master name they monitor."""

    kind = "redis"

    def __init__(self, sentinels: Sequence[RedisSentinel], label: str):
        self.sentinels, self.label = list(sentinels), label

    def ready(self) -> bool:
        return all(s.ready() for s in self.sentinels)

    def config(self, host: str) -> str:
        addresses = ", ".join(f'"{host}:{s.port}"' for s in self.sentinels)
        return (f"    kind: redis\n    sentinels: [{addresses}]\n"
                f"    master_name: {self.sentinels[0].master}\n"
                f"    connect_timeout: 200ms\n    acknowledged_handoff: true\n")


class PostgresFailover:
    """A PostgreSQL primary and its standby as the nodes see them: one libpq multi-host
    conninfo naming both, target_session_attrs=read-write, so a connection goes to whichever of
    them accepts writes (the primary; the standby once promoted)."""

    kind = "postgres"

    def __init__(self, primary: "PostgresCoordinator", standby: "PostgresCoordinator",
                 label: str):
        self.primary, self.standby, self.label = primary, standby, label

    def config(self, host: str) -> str:
        return (f"    kind: postgres\n    conninfo: \"host={host},{host} "
                f"port={self.primary.port},{self.standby.port} user={self.primary.user} "
                f"dbname=postgres connect_timeout=2 target_session_attrs=read-write\"\n"
                f"    acknowledged_handoff: true\n")


class EtcdMember(Coordinator):
    """One member of an EtcdCluster: its client port is `port` on `client_host`, its peer port
    on `peer_host`; `prefix` runs it inside a network namespace."""

    kind = "etcd"

    def __init__(self, workdir: Path, name: str, client_host: str, peer_host: str,
                 prefix: Sequence[str] = ()):
        super().__init__(workdir / name)
        self.name, self.client_host, self.peer_host = name, client_host, peer_host
        self.prefix = list(prefix)
        self.peer_port = free_port()
        self.initial_cluster, self.token = "", ""

    @property
    def endpoint(self) -> str:
        return f"{self.client_host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.peer_host}:{self.peer_port}"

    def _args(self) -> List[str]:
        client = f"http://{self.client_host}:{self.port}"
        return self.prefix + [
            "etcd", "--name", self.name, "--data-dir", str(self.dir / "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
            "--initial-cluster-token", self.token, "--logger", "zap", "--log-outputs", "stderr",
            # As the README advises (etcd's default from 3.5): a member cut off from its peers
            # does not raise its term, so its return does not depose the leader elected meanwhile.
            "--pre-vote"]

    def launch(self) -> None:
        self.proc = spawn(self._args(), self.log)

    def ready(self) -> bool:
        if not port_accepts(self.client_host, self.port):
            return False
        r = subprocess.run(["etcdctl", f"--endpoints={self.endpoint}", "--command-timeout=1s",
                            "endpoint", "health"], capture_output=True, text=True, timeout=5)
        return r.returncode == 0

    def keeps_state(self) -> bool:
        return True


class EtcdCluster:
    """A 3-member etcd cluster of a scenario's own (etcd's default election timeout, 1 s, and
    --pre-vote). With a network namespace, the last member runs inside it (its peer and client
    ports on the namespace's address), so that it can be cut off from the other two."""

    kind = "etcd"

    def __init__(self, workdir: Path, ns: Optional["NetNamespace"] = None, members: int = 3):
        self.ns = ns
        host = ns.host_ip if ns is not None else "127.0.0.1"
        self.members: List[EtcdMember] = []
        for i in range(members):
            inside = ns is not None and i == members - 1
            self.members.append(EtcdMember(
                workdir, f"m{i}", ns.ns_ip if inside else host, ns.ns_ip if inside else host,
                ns.prefix() if inside else ()))
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        token = f"sluice-faults-{os.getpid()}-{free_port()}"
        for m in self.members:
            m.initial_cluster, m.token = initial, token
        self.label = f"etcd, {members} members"

    def start(self, timeout: float = 30.0) -> None:
        for m in self.members:  # every member first: each serves clients once a quorum is up
            m.launch()
        wait_until(lambda: all(m.ready() for m in self.members), timeout, 0.1,
                   "every etcd member healthy")

    def ready(self) -> bool:
        return all(m.ready() for m in self.members if m.proc is not None
                   and m.proc.poll() is None)

    def restart(self, m: EtcdMember) -> None:
        m.proc = spawn(m._args(), m.log)
        wait_until(m.ready, 30, 0.1, f"etcd {m.name} back")

    def leader(self, among: Optional[Sequence[EtcdMember]] = None) -> Optional[EtcdMember]:
        """The member that says it leads (etcdctl endpoint status), or None."""
        live = [m for m in (among or self.members) if m.proc is not None
                and m.proc.poll() is None]
        if not live:
            return None
        r = subprocess.run(["etcdctl", "--endpoints=" + ",".join(m.endpoint for m in live),
                            "--command-timeout=1s", "endpoint", "status"],
                           capture_output=True, text=True, timeout=10)
        for line in r.stdout.splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) >= 5 and cells[4] == "true":
                for m in live:
                    if cells[0] == m.endpoint:
                        return m
        return None

    def make_leader(self, member: EtcdMember) -> None:
        """Moves the leadership to `member` (etcdctl move-leader) unless it leads already."""
        leader = self.leader()
        if leader is member:
            return
        assert leader is not None, "no etcd member says it leads"
        status = subprocess.run(["etcdctl", f"--endpoints={member.endpoint}", "endpoint",
                                 "status"], capture_output=True, text=True, timeout=10).stdout
        member_id = status.split(",")[1].strip()
        subprocess.run(["etcdctl", f"--endpoints={leader.endpoint}", "move-leader", member_id],
                       capture_output=True, text=True, timeout=10, check=True)
        wait_until(lambda: self.leader() is member, 10, 0.05, "the moved leadership")

    def config(self, host: str, first: int = 0) -> str:
        """The coordinator entry naming every member, `first` the one tried first (a client
        stays on the member that answered it last)."""
        del host  # each member is reached at its own address
        order = self.members[first:] + self.members[:first]
        endpoints = ", ".join(f'"{m.endpoint}"' for m in order)
        return (f"    kind: etcd\n    endpoints: [{endpoints}]\n"
                f"    connect_timeout: 200ms\n    acknowledged_handoff: true\n")

    def starting_at(self, first: int) -> "EtcdView":
        return EtcdView(self, first)

    def stop(self) -> None:
        for m in self.members:
            m.stop()


class EtcdView:
    """An EtcdCluster as the nodes given it see it: every member, `first` tried first."""

    kind = "etcd"

    def __init__(self, cluster: EtcdCluster, first: int):
        self.cluster, self.first, self.label = cluster, first, cluster.label

    def config(self, host: str) -> str:
        return self.cluster.config(host, self.first)


class RedisError(Exception):
    pass


class RedisClient:
    """One connection to a Redis (RESP over a socket), for commands in quick succession where a
    redis-cli process per command would be too slow."""

    def __init__(self, port: int, timeout: float = 5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._in = self.sock.makefile("rb")

    def command(self, *args) -> object:
        """The reply: str, int, None, a list of them; an error reply raises RedisError."""
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out += [b"$%d\r\n" % len(b), b, b"\r\n"]
        self.sock.sendall(b"".join(out))
        return self._reply()

    def _reply(self) -> object:
        line = self._in.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("redis: connection closed")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._in.read(n + 2)[:-2].decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RedisError(f"unexpected reply {line!r}")

    def info(self, section: str) -> Dict[str, str]:
        out = {}
        for line in str(self.command("INFO", section)).splitlines():
            k, sep, v = line.strip().partition(":")
            if sep:
                out[k] = v
        return out

    def close(self) -> None:
        self.sock.close()


class RedisKeyEvents:
    """The keys of one kind of keyspace event (`event`: "evicted", "expired"...) on a Redis, in
    the order it published them, collected by a thread from a SUBSCRIBE connection of its own
    (the server must have notify-keyspace-events set for them)."""

    def __init__(self, port: int, event: str):
        self.keys: List[str] = []
        self._client = RedisClient(port, timeout=None)
        self._client.command("SUBSCRIBE", f"__keyevent@0__:{event}")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                m = self._client._reply()
                if isinstance(m, list) and len(m) == 3 and m[0] == "message":
                    self.keys.append(m[2])
        except (OSError, ValueError, ConnectionError):
            return

    def stop(self) -> None:
        _close(self._client.sock)
        self._thread.join(5)


# ---- a network namespace for one node, and loss on its coordinator traffic ----

class NetNamespace:
    """A network namespace joined to the host by a veth pair (host 10.213.X.1, namespace
    10.213.X.2). `loss(percent, ports)` drops that share of the packets to and from the given
    host ports on the veth (nftables, numgen random), so only the node's coordinator traffic
    suffers, not the load generator's calls to the node."""

    def __init__(self, pid: Optional[int] = None):
        tag = os.getpid() if pid is None else pid  # interface names: at most 15 characters
        self.name = f"sluicefaults{tag}"
        self.host_if, self.ns_if = f"sfxh{tag}", f"sfxn{tag}"
        self.table = f"sluicefaults{tag}"
        octet = os.getpid() % 250 + 1
        self.host_ip, self.ns_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
        self.created = False

    @staticmethod
    def _run(cmd: str) -> None:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        if r.returncode != 0:
            raise OSError(f"{cmd}: {r.stderr.strip() or r.returncode}")

    @staticmethod
    def remove_stale() -> None:
        """Removes what a run killed before its cleanup left (the namespace outlives it): every
        namespace of ours whose test process is gone."""
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            pid = name[len("sluicefaults"):]
            if name.startswith("sluicefaults") and pid.isdigit() and not _running(int(pid)):
                NetNamespace(int(pid)).destroy()

    def create(self) -> None:
        for tool in ("ip", "nft"):
            if shutil.which(tool) is None:
                raise OSError(f"{tool} is not installed")
        self.remove_stale()
        self._run(f"ip netns add {self.name}")
        self.created = True
        self._run(f"ip link add {self.host_if} type veth peer name {self.ns_if}")
        self._run(f"ip link set {self.ns_if} netns {self.name}")
        self._run(f"ip addr add {self.host_ip}/30 dev {self.host_if}")
        self._run(f"ip link set {self.host_if} up")
        ns = f"ip netns exec {self.name}"
        self._run(f"{ns} ip addr add {self.ns_ip}/30 dev {self.ns_if}")
        self._run(f"{ns} ip link set {self.ns_if} up")
        self._run(f"{ns} ip link set lo up")
        self._run(f"nft add table inet {self.table}")
        self._run(f"nft add chain inet {self.table} out "
                  f"'{{ type filter hook output priority 0; }}'")
        self._run(f"nft add chain inet {self.table} in "
                  f"'{{ type filter hook input priority 0; }}'")

    def loss(self, percent: int, ports: Sequence[int]) -> None:
        ps = ", ".join(str(p) for p in ports)
        self._run(f"nft add rule inet {self.table} out oifname {self.host_if} "
                  f"tcp sport {{ {ps} }} numgen random mod 100 '<' {percent} counter drop")
        self._run(f"nft add rule inet {self.table} in iifname {self.host_if} "
                  f"tcp dport {{ {ps} }} numgen random mod 100 '<' {percent} counter drop")

    def cut(self, ports: Sequence[int]) -> None:
        """Drops every packet on the veth to or from any of `ports`, both ways."""
        ps = ", ".join(str(p) for p in ports)
        for chain, iface in (("out", "oifname"), ("in", "iifname")):
            for field in ("sport", "dport"):
                self._run(f"nft add rule inet {self.table} {chain} {iface} {self.host_if} "
                          f"tcp {field} {{ {ps} }} counter drop")

    def dropped(self) -> int:
        r = subprocess.run(f"nft -j list table inet {self.table}", shell=True,
                           capture_output=True, text=True)
        total = 0
        for item in json.loads(r.stdout or "{}").get("nftables", []):
            for e in item.get("rule", {}).get("expr", []):
                if "counter" in e:
                    total += e["counter"]["packets"]
        return total

    def clear(self) -> None:
        self._run(f"nft flush chain inet {self.table} out")
        self._run(f"nft flush chain inet {self.table} in")

    def prefix(self) -> List[str]:
        return ["ip", "netns", "exec", self.name]

    def destroy(self) -> None:
        for cmd in (f"nft delete table inet {self.table}", f"ip link del {self.host_if}",
                    f"ip netns del {self.name}"):
            subprocess.run(cmd, shell=True, capture_output=True)


# ---- sluice nodes ----

@dataclass
class FleetConfig:
    limit: int = 12  # every node's L_local (algorithm fixed), so L_global (the median) too
    heartbeat_ms: int = 200
    lease_ms: int = 1000
    outage: str = "fail-closed"
    call_lease_ttl: str = "2s"  # server.lease_ttl: a lease nobody releases ends after this
    call_deadline_ms: Optional[int] = None  # the fleet's call_deadline; None: its default


class Node:
    # The deadline of the load's checks: what a check may take, and a quarter-second more.
    check_timeout = 0.5
    """One `sluice serve` in the fleet. `prefix` runs it inside a network namespace, `env`
    under libfaketime."""

    def __init__(self, workdir: Path, name: str, binary: str, coordinator: Coordinator,
                 key: str, fleet: FleetConfig, host: str = "127.0.0.1",
                 coordinator_host: str = "127.0.0.1", prefix: Sequence[str] = (),
                 env: Optional[Dict[str, str]] = None):
        self.name, self.binary, self.host = name, binary, host
        self.prefix, self.env = list(prefix), env
        self.config_path = workdir / f"{name}.yaml"
        self.log = workdir / f"{name}.log"
        self.config_path.write_text(self._config(coordinator, coordinator_host, key, fleet))
        self.proc: Optional[subprocess.Popen] = None
        self.grpc_port = self.http_port = 0
        self.client: Optional[sluice_client.Client] = None
        self.fault = ""  # "", "killed", "stopped": what the test is doing to it now
        self.faulted = False  # the test killed or stopped it at some point

    def _config(self, coordinator: Coordinator, coordinator_host: str, key: str,
                fleet: FleetConfig) -> str:
        return (
            f"server:\n  node_id: {self.name}\n  lease_ttl: {fleet.call_lease_ttl}\n"
            f"  shutdown_grace: 1s\n"
            f"coordinators:\n  coord:\n{coordinator.config(coordinator_host)}"
            f"policies:\n  f:\n    kind: fleet\n    coordinator: coord\n    key: {key}\n"
            f"    algorithm: fixed\n    limit: {fleet.limit}\n"
            f"    heartbeat: {fleet.heartbeat_ms}ms\n    lease_ttl: {fleet.lease_ms}ms\n"
            f"    outage: {fleet.outage}\n"
            + (f"    call_deadline: {fleet.call_deadline_ms}ms\n"
               if fleet.call_deadline_ms is not None else ""))

    def launch(self) -> None:
        # Inside a namespace every port is free; on the host, the kernel's pick.
        self.grpc_port, self.http_port = free_port(), free_port()
        args = self.prefix + [self.binary, "serve", "--grpc", f"{self.host}:{self.grpc_port}",
                              "--http", f"{self.host}:{self.http_port}",
                              "--config", str(self.config_path)]
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = spawn(args, self.log, env=env)

    def wait_serving(self, timeout: float = 20.0) -> None:
        relaunches = [0]

        def up():
            if self.proc.poll() is not None:
                # A port picked free can still be taken by another process before the node
                # binds it: launch again on other ports (twice at most).
                if "already in use" in tail(self.log) and relaunches[0] < 2:
                    relaunches[0] += 1
                    self.launch()
                    return False
                raise AssertionError(f"{self.name} exited:\n{tail(self.log)}")
            return "serving" in tail(self.log, 100000) and self.http_ok("/healthz")
        wait_until(up, timeout, what=f"{self.name} to serve")
        target = f"{self.host}:{self.grpc_port}"
        self.client = sluice_client.Client(target, timeout=self.check_timeout)
        # Release gets longer: on a busy machine a healthy node may take over 0.5 s to answer,
        # and a release that timed out would look like a lost lease.
        self.release_client = sluice_client.Client(target, timeout=3.0)

    def http_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.http_port}{path}",
                                        timeout=0.5) as r:
                return r.status == 200
        except OSError:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def state(self) -> Optional[dict]:
        """The fleet policy's state from ListPolicies, or None when the node does not answer."""
        try:
            p = self.client.policies().by_name["f"]
        except (sluice_client.SluiceError, KeyError, AttributeError):
            return None
        s = dict(p.state)
        s["in_flight"] = p.in_flight
        return s

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.release_client.close()
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


# ---- load, truth and sampling ----

@dataclass
class CallRecord:
    node: str
    admitted_at: float
    ended_at: float = 0.0
    release: str = ""  # "ok", or the error's code name


class LoadGenerator:
    """`threads` clients, each in a loop: Admit on a random node, hold the permit for a random
    time, end the call, Release. The call counts as running in the backend from the moment the
    Admit answer arrives until the client ends it (before it sends Release), so `in_flight` is
    exactly the number of calls the backend sees.

    `deadline` (seconds): every call ends at most that long after its Admit was sent, whether
    or not its node can be reached (a client that honours a call timeout). `honour_deadline`:
    every call also ends by the call deadline its admission named (Lease.deadline), as the
    fleet's bound requires of a backend; False only for a control run that breaks the rule."""

    def __init__(self, nodes: List[Node], threads: int = 24, hold=(0.05, 0.3),
                 deadline: Optional[float] = None, seed: int = 1, honour_deadline: bool = True):
        self.nodes, self.threads, self.hold, self.deadline = nodes, threads, hold, deadline
        self.honour_deadline = honour_deadline
        self._lock = threading.Lock()
        self._in_flight: Dict[str, int] = {n.name: 0 for n in nodes}
        self.calls: List[CallRecord] = []
        self.refused = 0
        self.refused_by: Dict[str, int] = {}  # by node name
        self.admit_errors = 0
        self._stop = threading.Event()
        self._workers: List[threading.Thread] = []
        self._seed = seed

    def in_flight(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._in_flight)

    def start(self) -> None:
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(random.Random(self._seed * 1000 + i),),
                                 daemon=True)
            t.start()
            self._workers.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(10)
        assert not any(t.is_alive() for t in self._workers), "a load thread did not finish"

    def _run(self, rng: random.Random) -> None:
        while not self._stop.is_set():
            node = rng.choice(self.nodes)
            sent = time.monotonic()
            try:
                lease = node.client.admit("f")
            except sluice_client.Refused:
                with self._lock:
                    self.refused += 1
                    self.refused_by[node.name] = self.refused_by.get(node.name, 0) + 1
                time.sleep(rng.uniform(0.005, 0.02))
                continue
            except (sluice_client.SluiceError, ValueError, AttributeError):
                with self._lock:
                    self.admit_errors += 1
                time.sleep(rng.uniform(0.02, 0.05))
                continue
            rec = CallRecord(node.name, time.monotonic())
            with self._lock:  # a node may join the list after the start (a twin)
                self._in_flight[node.name] = self._in_flight.get(node.name, 0) + 1
                self.calls.append(rec)
            end = rec.admitted_at + rng.uniform(*self.hold)
            if self.deadline is not None:
                end = min(end, sent + self.deadline)
            if self.honour_deadline and lease.deadline is not None:
                end = min(end, lease.deadline)  # the deadline the admission named
            time.sleep(max(0.0, end - time.monotonic()))
            with self._lock:
                self._in_flight[node.name] -= 1
                rec.ended_at = time.monotonic()
            try:
                node.release_client.release(lease, rtt=rec.ended_at - rec.admitted_at)
                rec.release = "ok"
            except sluice_client.SluiceError as e:
                rec.release = e.code.name


@dataclass
class Sample:
    t: float
    total: int
    by_node: Dict[str, int]


class Sampler:
    """Every `period` seconds: the true Σ in-flight, checked against `bound`; and, from a
    second thread, each node's fleet state (ListPolicies), kept as the latest seen."""

    def __init__(self, load: LoadGenerator, nodes: List[Node], bound: int,
                 period: float = 0.025, poll: float = 0.1):
        self.load, self.nodes, self.bound = load, nodes, bound
        self.period, self.poll = period, poll
        self.samples: List[Sample] = []
        self.violations: List[Sample] = []
        self.states: Dict[str, Optional[dict]] = {n.name: None for n in nodes}
        self.state_log: List[tuple] = []  # (t, {node: state})
        self.l_global_seen: set = set()
        self.phases_seen: Dict[str, set] = {}  # since the last reset_phases()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample, daemon=True),
                         threading.Thread(target=self._poll, daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _sample(self) -> None:
        while not self._stop.is_set():
            by_node = self.load.in_flight()
            s = Sample(time.monotonic(), sum(by_node.values()), by_node)
            self.samples.append(s)
            if s.total > self.bound:
                self.violations.append(s)
            time.sleep(self.period)

    def _poll(self) -> None:
        while not self._stop.is_set():
            snap = {}
            for n in self.nodes:
                st = n.state() if n.fault == "" and n.running() else None
                snap[n.name] = st
                if st is not None and st.get("phase") == "active":
                    self.l_global_seen.add(st.get("l_global"))
            self.states = snap
            for n in self.nodes:
                st = snap[n.name]
                self.phases_seen.setdefault(n.name, set()).add(
                    n.fault or ("unreachable" if st is None else st.get("phase")))
            self.state_log.append((time.monotonic(), snap))
            time.sleep(self.poll)

    def reset_phases(self) -> None:
        self.phases_seen = {}

    def max_gap(self) -> float:
        """The longest time between two samples (seconds)."""
        ts = [s.t for s in self.samples]
        return max((b - a for a, b in zip(ts, ts[1:])), default=0.0)

    def max_total(self) -> int:
        return max((s.total for s in self.samples), default=0)


def fleet_whole(nodes: List[Node], limit: int) -> bool:
    """Every node answers, is active, sees all of them and L_global = limit, no coordinator is
    recovering from a loss of its state, and their shares add up to L_global: the fleet serves
    at its full ceiling."""
    states = [n.state() for n in nodes]
    if any(s is None for s in states):
        return False
    return (all(s.get("phase") == "active" and s.get("l_global") == limit
                and s.get("nodes") == len(nodes) and not s.get("recovering") for s in states)
            and sum(s.get("share", 0) for s in states) == limit)


# ---- federation: regions sharing one rate budget, checks counted per coordinator window ----

@dataclass
class FederationConfig:
    limit: int = 300  # hits per window for all regions together
    window_ms: int = 2000  # the coordinator's window (its clock, aligned on the Unix epoch)
    batch: int = 16
    budget: str = "hot"  # the budget's name at the coordinator, shared by the regions
    lease_timeout_ms: int = 250
    retry_backoff_ms: int = 1000


@dataclass
class PoolConfig:
    """A regional pool shared by the processes of one region: its Redis (a coordinator entry
    of its own, `pool`, named by the policy's regional_escrow) and the policy's pool fields."""
    redis: Coordinator
    regional_batch: int = 64
    outage: str = "fail-closed"  # or regional-only
    health_check_ms: int = 1000  # coordinator_health_check


class FederatedNode(Node):
    """One `sluice serve` serving one region of a federated budget (policy `g`); `name` tells
    apart the processes of one region (default: the region), `pool` gives them a regional
    pool."""

    POLICY = "g"

    def __init__(self, workdir: Path, region: str, binary: str, coordinator: Coordinator,
                 fed: FederationConfig, name: Optional[str] = None,
                 pool: Optional[PoolConfig] = None):
        self.region, self.fed, self.pool = region, fed, pool
        # A check that leases waits for at most one coordinator call (lease_timeout); with a
        # pool, for up to three (take, lease, refill: sluice/core/pool_lease.h), each bounded
        # by lease_timeout. Three quarters of a second more: in CI the suite shares 2 cores
        # with other tests (a PostgreSQL's initdb, a model search), and a region starved that
        # long is not a check that hangs (which this deadline is there to catch).
        calls = 3 if pool is not None else 1
        self.check_timeout = calls * fed.lease_timeout_ms / 1000 + 0.75
        super().__init__(workdir, name or region, binary, coordinator, fed.budget,
                         FleetConfig())

    def _config(self, coordinator: Coordinator, coordinator_host: str, key: str,
                fleet: FleetConfig) -> str:
        f, p = self.fed, self.pool
        return (f"server:\n  node_id: {self.name}\n  shutdown_grace: 1s\n"
                f"coordinators:\n  coord:\n{coordinator.config(coordinator_host)}"
                + (f"  pool:\n{p.redis.config(coordinator_host)}" if p else "")
                + f"policies:\n  {self.POLICY}:\n    kind: federated\n    coordinator: coord\n"
                f"    budget: {f.budget}\n    region: {self.region}\n    limit: {f.limit}\n"
                f"    window: {f.window_ms}ms\n    batch: {f.batch}\n"
                f"    lease_timeout: {f.lease_timeout_ms}ms\n"
                f"    retry_backoff: {f.retry_backoff_ms}ms\n"
                + (f"    regional_escrow: pool\n    regional_batch: {p.regional_batch}\n"
                   f"    outage: {p.outage}\n"
                   f"    coordinator_health_check: {p.health_check_ms}ms\n" if p else ""))

    def fed_state(self) -> Optional[dict]:
        """The federated policy's counters from /v1/policies (granted, spent, forfeited,
        leases, lease_failures...), or None when the node does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/v1/policies",
                                        timeout=1.0) as r:
                body = json.loads(r.read())
        except (OSError, ValueError):
            return None
        return next((p for p in body.get("policies", []) if p.get("name") == self.POLICY), None)


def redis_info_says(c: Coordinator, section: str, text: str) -> bool:
    """Whether `INFO section` on `c` holds `text`; False when it cannot be asked (a Redis the
    sentinels are reconfiguring closes its clients' connections)."""
    try:
        return text in redis_cli(c, "INFO", section)
    except AssertionError:
        return False


def redis_cli(c: Coordinator, *args: str) -> str:
    """One redis-cli command on `c`'s Redis; its output, stripped."""
    r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(c.port), *args],
                       capture_output=True, text=True, timeout=5)
    if r.returncode != 0:
        raise AssertionError(f"redis-cli {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


def sentinels_ready(sentinels: Sequence["RedisSentinel"], replica: Coordinator) -> bool:
    """Whether every sentinel knows `replica` and can reach its quorum and a failover's
    authorization (SENTINEL CKQUORUM): sentinels learn of each other from hello messages every
    2 s, and a primary killed before that is never failed over."""
    return all(str(replica.port) in redis_cli(s, "SENTINEL", "replicas", s.master) and
               redis_cli(s, "SENTINEL", "CKQUORUM", s.master).startswith("OK")
               for s in sentinels)


@dataclass
class RedisLease:
    t: float  # Redis's clock when it received the call (same machine: the wall clock)
    region: str
    want: int


class RedisMonitor:
    """`redis-cli monitor` on a coordinator Redis, started and stopped by its pid: every lease
    call (the escrow script's "lease" mode) that reached it, with its region and size. MONITOR
    lists a command when Redis reads it: a lease sent while Redis was stopped shows up once it
    runs again."""

    def __init__(self, c: Coordinator, log: Path):
        self.log = log
        self.proc = spawn(["redis-cli", "-h", "127.0.0.1", "-p", str(c.port), "monitor"], log)
        wait_until(lambda: "OK" in tail(log, 100), 5, what="redis-cli monitor")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)

    def leases(self) -> List[RedisLease]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            # 1700000000.123456 [0 127.0.0.1:4242] "EVALSHA" "<sha>" "<numkeys>" "<k1>"...
            # "lease" "<now>" "<ttl>" "<region>" "<limit>" "<period>" "<want>" ...
            head, _, rest = line.partition(" [")
            words = rest.split('"')[1::2]  # the quoted words (ours never hold a quote)
            if len(words) < 3 or words[0].upper() != "EVALSHA" or not words[2].isdigit():
                continue
            args = words[3 + int(words[2]):]
            if len(args) < 7 or args[0] != "lease":
                continue
            out.append(RedisLease(float(head), args[3], int(args[6])))
        return out


@dataclass
class CheckRecord:
    region: str
    key: str
    sent: float  # wall clock (time.time()) when the Check was sent
    received: float  # ... and when its answer arrived; the decision fell in between
    allowed: bool
    reason: str  # the refusal's reason, "error: CODE" when the call failed, "" when allowed


class CheckLoad:
    """Paced Check calls over gRPC: for each region, `threads_per_region` threads that together
    send `rate * weight / sum(weights)` checks per second on `key` (the weights: how the load is
    skewed among the regions). Every call is recorded with its wall-clock send and answer times,
    so the admissions can be attributed to the coordinator's windows (same machine, same
    clock)."""

    def __init__(self, nodes: List[FederatedNode], rate: float, weights: Sequence[float],
                 key: str = "k", threads_per_region: int = 2):
        assert len(weights) == len(nodes)
        self.nodes, self.rate, self.weights, self.key = nodes, rate, list(weights), key
        self.threads_per_region = threads_per_region
        self.records: List[CheckRecord] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: List[threading.Thread] = []

    def start(self) -> None:
        total = sum(self.weights)
        for node, w in zip(self.nodes, self.weights):
            if w <= 0:
                continue
            period = self.threads_per_region / (self.rate * w / total)
            for i in range(self.threads_per_region):
                t = threading.Thread(target=self._run,
                                     args=(node, period, i * period / self.threads_per_region),
                                     daemon=True)
                t.start()
                self._workers.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(10)
        assert not any(t.is_alive() for t in self._workers), "a check thread did not finish"

    def _run(self, node: FederatedNode, period: float, offset: float) -> None:
        next_at = time.monotonic() + offset
        while not self._stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            # Paced, not bursty: a call that took longer than the period is not made up for.
            next_at = max(next_at + period, time.monotonic())
            sent = time.time()
            try:
                d = node.client.check(node.POLICY, self.key)
                allowed, reason = d.allowed, ("" if d.allowed else d.reason)
            except sluice_client.SluiceError as e:
                allowed, reason = False, f"error: {getattr(e.code, 'name', e.code)}"
            rec = CheckRecord(node.region, self.key, sent, time.time(), allowed, reason)
            with self._lock:
                self.records.append(rec)

    def snapshot(self) -> List[CheckRecord]:
        with self._lock:
            return list(self.records)


def window_of(t: float, window: float) -> int:
    """The coordinator window that wall-clock time `t` falls in: windows are aligned on multiples
    of the window since the Unix epoch."""
    return int(t // window)


def windows_touched(rec: CheckRecord, window: float, guard: float) -> range:
    """Every window the decision of `rec` may have fallen in: its [sent, received] interval,
    widened by `guard` on both sides (clock reads are not exactly at the decision)."""
    return range(window_of(rec.sent - guard, window), window_of(rec.received + guard, window) + 1)


@dataclass
class WindowCount:
    index: int
    offered: int = 0  # checks sent in the window
    admitted: int = 0  # admissions answered in the window (the point estimate)
    definite: int = 0  # admissions whose whole guarded interval lies in the window
    upper: int = 0  # admissions that may have fallen in the window (straddlers in both)
    assigned: int = 0  # definite + the straddlers least_assignment() put here
    refusals: Dict[str, int] = None  # reason -> refusals decided surely in the window

    def __post_init__(self):
        if self.refusals is None:
            self.refusals = {}


def per_window(records: Sequence[CheckRecord], window: float,
               guard: float) -> Dict[int, WindowCount]:
    """Admissions and refusals per coordinator window. `upper` counts an admission in every
    window it may have fallen in, so it can only over-count: `upper <= limit` in every window
    is a sound check of the bound."""
    out: Dict[int, WindowCount] = {}

    def at(i: int) -> WindowCount:
        return out.setdefault(i, WindowCount(i))

    for r in records:
        at(window_of(r.sent, window)).offered += 1
        span = windows_touched(r, window, guard)
        if not r.allowed:
            if len(span) == 1:
                c = at(span[0])
                c.refusals[r.reason] = c.refusals.get(r.reason, 0) + 1
            continue
        at(window_of(r.received, window)).admitted += 1
        for i in span:
            at(i).upper += 1
        if len(span) == 1:
            at(span[0]).definite += 1
    return dict(sorted(out.items()))


def least_assignment(records: Sequence[CheckRecord], counts: Dict[int, WindowCount],
                     window: float, guard: float, limit: int) -> List[int]:
    """Puts every admission that straddles a boundary into one of the windows it may have fallen
    in, so that as few windows as possible exceed `limit` (earliest deadline first: each window
    takes, while it has room, the straddlers whose last possible window ends soonest; what no
    window has room for goes to its last). Sets each count's `assigned` and returns the windows
    over `limit` even so: each of them is a proven overshoot, whatever the exact decision times
    were. An empty list means the observations are consistent with the bound; the ambiguity
    left is the straddlers' number (upper - assigned)."""
    straddlers = []
    for r in records:
        if r.allowed:
            span = windows_touched(r, window, guard)
            if len(span) > 1:
                straddlers.append((span.start, span.stop - 1))
    for c in counts.values():
        c.assigned = c.definite
    straddlers.sort()
    pending: List[int] = []  # last possible windows of the straddlers not yet placed
    over, j = [], 0
    for i in sorted(counts):
        while j < len(straddlers) and straddlers[j][0] <= i:
            heapq.heappush(pending, straddlers[j][1])
            j += 1
        c = counts[i]
        while pending and (c.assigned < limit or pending[0] <= i):
            heapq.heappop(pending)
            c.assigned += 1
        if c.assigned > limit:
            over.append(i)
    return over
