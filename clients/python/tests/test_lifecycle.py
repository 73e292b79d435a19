"""The server's lifecycle: SIGHUP reload, graceful SIGTERM, gRPC health and reflection."""

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest

from conftest import metric, wait_until
from sluice_client import NotFound, Unavailable

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"


def raw_unary(channel, method):
    return channel.unary_unary(method, request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)


def health(target, service=b""):
    """The raw HealthCheckResponse for `service` (b"": the server as a whole)."""
    with grpc.insecure_channel(target) as channel:
        request = b"\x0a" + bytes([len(service)]) + service if service else b""
        return raw_unary(channel, HEALTH_CHECK)(request, timeout=5)


def test_grpc_health(server):
    assert health(server.grpc_target) == SERVING
    with pytest.raises(grpc.RpcError) as info:
        health(server.grpc_target, b"no.such.Service")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_reflection_lists_the_service(server):
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.stream_stream(REFLECTION, request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        responses = list(call(iter([b"\x3a\x00"]), timeout=5))  # list_services: ""
    assert len(responses) == 1
    assert b"sluice.v1.Sluice" in responses[0]
    assert b"grpc.health.v1.Health" in responses[0]


BASE = textwrap.dedent("""\
    server:
      lease_ttl: 30s
    policies:
      pool:
        kind: adaptive
        algorithm: fixed
        limit: 5
""")

WITH_NEW_RATE = BASE + """\
  added-rate:
    kind: rate
    limit: 7
    period: 1s
"""

BROKEN = WITH_NEW_RATE.replace("limit: 5", "limit: -3")


def test_sighup_reload_keeps_leases_and_rejects_a_broken_file(start_server):
    server = start_server(BASE)
    client = server.client()
    ps = client.policies()
    assert set(ps) == {"pool"} and ps.config_generation == 1
    lease = client.admit("pool")
    assert client.policies()["pool"].in_flight == 1

    # A new policy next to the unchanged one.
    server.write_config(WITH_NEW_RATE)
    server.signal(signal.SIGHUP)
    ps = wait_until(lambda: (lambda p: p if "added-rate" in p else None)(client.policies()),
                    timeout=5, what="added-rate to appear after SIGHUP")
    assert ps.config_generation == 2
    assert ps["added-rate"].kind == "rate" and ps["added-rate"].limit == 7
    assert ps["pool"].in_flight == 1  # carried over: the same policy object, its permit held
    assert ps["pool"].state["retired"] is False
    assert client.check("added-rate", "k").allowed
    assert client.release(lease) >= 0
    assert client.policies()["pool"].in_flight == 0
    # Logged once the new generation serves: it may come just after.
    wait_until(lambda: "reloaded (generation 2): added added-rate, changed -, removed -, kept pool"
               in server.log(), timeout=5, what="the reload's log line")

    # A broken file: rejected, logged with its line, and the old config keeps serving.
    server.write_config(BROKEN)
    server.signal(signal.SIGHUP)
    wait_until(lambda: "reload rejected" in server.log(), timeout=5,
               what="the rejected reload in the log")
    log = server.log()
    error_lines = [line for line in log.splitlines() if "policies.pool.limit" in line]
    assert error_lines, log
    assert re.search(r"\.yaml:\d+:\d+: policies\.pool\.limit", error_lines[0]), error_lines[0]
    assert "old config keeps serving" in log
    ps = client.policies()
    assert set(ps) == {"pool", "added-rate"} and ps.config_generation == 2
    assert ps["pool"].limit == 5
    with client.lease("pool"):
        assert client.policies()["pool"].in_flight == 1
    assert client.check("added-rate", "k2").allowed
    samples = server.metrics()
    assert metric(samples, "sluice_config_reloads_total", result="ok") == 1
    assert metric(samples, "sluice_config_reloads_total", result="error") == 1
    assert server.running()


def test_reload_that_changes_and_removes_policies(start_server):
    extra = "  extra:\n    kind: adaptive\n    algorithm: fixed\n    limit: 1\n"
    server = start_server(WITH_NEW_RATE + extra)
    client = server.client()
    on_pool, on_extra = client.admit("pool"), client.admit("extra")
    server.write_config(WITH_NEW_RATE.replace("limit: 5", "limit: 6"))  # pool changed, extra gone
    server.signal(signal.SIGHUP)
    wait_until(lambda: client.policies().config_generation == 2, timeout=5, what="the reload")
    ps = client.policies()
    assert set(ps) == {"pool", "added-rate"}
    # pool took its new limit in place: the lease it holds still counts against it
    assert ps["pool"].limit == 6 and ps["pool"].in_flight == 1
    assert ps.leases == 2  # the lease on the removed policy keeps its permit too
    # The reload's summary is logged once the new generation serves: it may come just after.
    wait_until(lambda: "removed extra" in server.log(), timeout=5, what="the reload's log line")
    assert "reconfigured in place pool" in server.log()
    with pytest.raises(NotFound):
        client.admit("extra")
    # Leases on the replaced and the removed policy still release.
    assert client.release(on_pool) >= 0
    assert client.release(on_extra) >= 0
    assert client.policies().leases == 0

    server.write_config(BASE)
    server.signal(signal.SIGHUP)
    wait_until(lambda: "added-rate" not in client.policies(), timeout=5,
               what="added-rate to go")
    with pytest.raises(NotFound):
        client.check("added-rate", "k")


RESTART_ONLY = {  # a running server cannot apply these: each needs a restart
    "grpc": "127.0.0.1:1", "http": "127.0.0.1:2", "node_id": "gw-9", "max_connections": "5",
    "idle_timeout": "2s", "request_timeout": "500ms", "keepalive": "45s",
    "max_streams_per_connection": "8", "max_watch_streams": "7",
}


def test_a_reload_that_changes_what_needs_a_restart_is_refused_naming_each(start_server):
    server = start_server(BASE)
    client = server.client()
    server.write_config(BASE.replace("server:\n", "server:\n" + "".join(
        f"  {k}: {v}\n" for k, v in RESTART_ONLY.items())).replace("limit: 5", "limit: 6"))
    r = server.http("POST", "/admin/reload")
    assert r.status == 400 and r.json()["reloaded"] is False, r
    message = r.json()["message"]
    # Each setting with its value in force and the file's; the flags the test starts the
    # server with are named where they override the file.
    assert f"server.grpc ('127.0.0.1:7070' -> '127.0.0.1:1') [--grpc {server.grpc_target} " \
        "overrides it]" in message, message
    assert "server.http ('127.0.0.1:8080' -> '127.0.0.1:2') [--http 127.0.0.1:" in message
    for part in ["server.node_id (unset -> 'gw-9')", "server.max_connections (10000 -> 5)",
                 "server.idle_timeout (1m -> 2s)", "server.request_timeout (10s -> 500ms)",
                 "server.keepalive (30s -> 45s)",
                 "server.max_streams_per_connection (1000 -> 8)",
                 "server.max_watch_streams (1000 -> 7)", "restart it to apply them",
                 "the old config keeps serving"]:
        assert part in message, (part, message)
    # Nothing of the file was applied: not the policy's new limit either.
    ps = client.policies()
    assert ps.config_generation == 1 and ps["pool"].limit == 5
    assert "reload rejected: changed server.grpc" in server.log()

    # SIGHUP: the same refusal, in the log.
    server.signal(signal.SIGHUP)
    wait_until(lambda: server.log().count("reload rejected: changed server.grpc") == 2,
               timeout=5, what="the SIGHUP reload refused")
    assert client.policies().config_generation == 1
    samples = server.metrics()
    assert metric(samples, "sluice_config_reloads_total", result="error") == 2
    assert metric(samples, "sluice_config_reloads_total", result="ok") == 0

    # One setting put back still refuses the rest; all of them put back, the reload goes on.
    server.write_config(BASE.replace("server:\n", "server:\n  keepalive: 45s\n"))
    r = server.http("POST", "/admin/reload")
    assert r.status == 400 and "server.keepalive (30s -> 45s)" in r.json()["message"]
    assert "server.grpc" not in r.json()["message"]
    server.write_config(BASE.replace("lease_ttl: 30s", "lease_ttl: 20s")
                        .replace("limit: 5", "limit: 6"))
    r = server.http("POST", "/admin/reload")
    assert r.status == 200 and r.json()["reloaded"] is True, r
    ps = client.policies()
    assert ps.config_generation == 2 and ps["pool"].limit == 6


FLEET_ONE = textwrap.dedent("""\
    policies:
      first:
        kind: fleet
        key: shared
        algorithm: fixed
        limit: 4
""")
FLEET_TWO = FLEET_ONE + """\
  second:
    kind: fleet
    key: shared
    algorithm: fixed
    limit: 4
"""


def test_a_reload_that_adds_a_second_fleet_policy_on_one_key_is_refused(start_server):
    """Two fleet policies of one server on one key would be one member (one node id) admitting
    twice the share: a reload that makes them is refused, naming both, the key and the
    coordinator, and the first keeps its fleet to itself."""
    server = start_server(FLEET_ONE)
    client = server.client()
    server.write_config(FLEET_TWO)
    r = server.http("POST", "/admin/reload")
    assert r.status == 400 and r.json()["reloaded"] is False, r
    assert "the config has errors" in r.json()["message"]
    log = server.log()
    assert re.search(r"\.yaml:9:10: policies\.second\.key: policies first \(line 2\) and second "
                     r"both join coordinator 'memory' under key 'shared'", log), log
    ps = client.policies()
    assert set(ps) == {"first"} and ps.config_generation == 1
    wait_until(lambda: client.policies()["first"].state["phase"] == "active", timeout=5,
               what="the fleet guard active")
    leases = [client.admit("first") for _ in range(4)]
    r = server.http("POST", "/v1/admit", {"policy": "first"})
    assert r.status in (429, 503), r  # the share is the whole of L_global 4, and no more
    for lease in leases:
        client.release(lease)
    # With a key of its own, the second policy is its own fleet.
    server.write_config(FLEET_ONE + FLEET_TWO[len(FLEET_ONE):].replace("key: shared",
                                                                       "key: other"))
    r = server.http("POST", "/admin/reload")
    assert r.status == 200 and r.json()["reloaded"] is True, r
    assert set(client.policies()) == {"first", "second"}


DRAIN_CONFIG = textwrap.dedent("""\
    server:
      shutdown_grace: 8s
    policies:
      r:
        kind: rate
        limit: 100
      pool:
        kind: adaptive
        algorithm: fixed
        limit: 5
""")


def test_graceful_sigterm_drains_then_exits_0(start_server):
    server = start_server(DRAIN_CONFIG)
    client = server.client()
    lease = client.admit("pool")
    assert client.check("r", "k").allowed
    server.signal(signal.SIGTERM)

    def refused():
        try:
            client.check("r", "k")
        except Unavailable as e:
            return e
        return None

    err = wait_until(refused, timeout=5, what="Check to answer UNAVAILABLE")
    assert "shutting down" in err.message
    with pytest.raises(Unavailable):
        client.admit("pool")
    assert server.running(), "exited while a lease was still held"
    assert health(server.grpc_target) == NOT_SERVING
    r = server.http("GET", "/readyz")
    assert r.status == 503 and "shutting down" in r.text
    r = server.http("POST", "/v1/check", {"policy": "r", "key": "k"})
    assert r.status == 503 and r.json()["error"]["code"] == "unavailable"
    with pytest.raises(Unavailable):
        client.peek("r", "k")
    with pytest.raises(Unavailable):
        client.check_many([("r", "k")])
    assert client.policies()["pool"].in_flight == 1  # state is still readable
    assert client.heartbeat(lease) > 0  # heartbeat still works while draining

    released_at = time.monotonic()
    assert client.release(lease) >= 0  # release still works
    try:
        code = server.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pytest.fail("the server did not exit after its last lease was released")
    assert code == 0
    assert time.monotonic() - released_at < 4  # well before the 8 s grace
    log = server.log()
    assert "shutting down" in log and "stopped (0 lease(s) were still held" in log


def test_sigterm_without_leases_exits_at_once(server):
    start = time.monotonic()
    server.signal(signal.SIGTERM)
    assert server.proc.wait(timeout=5) == 0
    assert time.monotonic() - start < 3


def test_sigterm_gives_up_on_held_leases_after_the_grace(start_server):
    server = start_server(DRAIN_CONFIG.replace("shutdown_grace: 8s", "shutdown_grace: 1s"))
    client = server.client()
    client.admit("pool")  # never released
    start = time.monotonic()
    server.signal(signal.SIGTERM)
    assert server.proc.wait(timeout=6) == 0
    assert 0.9 <= time.monotonic() - start < 4
    assert "stopped (1 lease(s) were still held" in server.log()


def test_a_server_dies_with_the_test_process_that_started_it(tmp_path):
    """A test process killed with SIGKILL (a runner's timeout) leaves no server running."""
    owner_code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from conftest import SluiceServer
        server = SluiceServer(Path({str(tmp_path)!r})).start()
        print(server.proc.pid, flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
    try:
        line = owner.stdout.readline()
        assert line.strip().isdigit(), f"the owner did not start a server: {line!r}"
        pid = int(line)
        assert process_running(pid)
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
    wait_until(lambda: not process_running(pid), timeout=5,
               what=f"sluice serve {pid} to die with the process that started it")


def process_running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"
