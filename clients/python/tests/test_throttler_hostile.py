"""The throttler against hostile input: app names that are not UTF-8 or too long are refused
on every route that takes one, and no stored string (an app
name, a probe's error) can break a listing, a metric scrape or gRPC ListPolicies."""

import json
import os
import signal
import socket
import subprocess
import time

import grpc
import pytest

from conftest import sluice_bin, wait_until
from test_throttler import config


def listings_answer(server):
    """Every listing answers, as valid UTF-8 and valid JSON where it is JSON."""
    policies = server.http("GET", "/v1/policies")
    assert policies.status == 200, policies
    policies.json()
    recent = server.http("GET", "/throttler/recent-apps")
    assert recent.status == 200, recent
    recent.json()
    scrape = server.http("GET", "/metrics")
    assert scrape.status == 200, scrape
    scrape.body.decode("utf-8")  # strict: raises on a byte that is not UTF-8
    with server.client() as c:
        assert "db" in c.policies()
    return recent.json()


@pytest.mark.parametrize("route", [
    "/throttler/check?app=%FF",
    "/throttler/check-self?app=%C0%AF",            # an overlong '/'
    "/throttler/check?app=ok%ED%A0%80",            # a surrogate
    "/check/%FF/mysql/main",
    "/check-read/%FE%FF/mysql/main/3",
    "/throttler/check?app=" + "x" * 257,
    "/throttler/throttle-app?app=%FF",
    "/throttle-app/%FF",
])
def test_an_app_name_that_is_not_one_is_refused_and_stores_nothing(start_server, tmp_path,
                                                                    route):
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    wait_until(lambda: server.http("GET", "/throttler/check?app=fine").status == 200, 5,
               what="the first sample")
    r = server.http("GET", route)
    assert r.status == 400, r
    message = r.json()["Message"] if "Message" in r.json() else r.json()["error"]["message"]
    assert message.startswith("app: "), message
    apps = listings_answer(server)["apps"]
    assert [a["app"] for a in apps] == ["fine"], apps


def test_a_grpc_check_with_an_app_that_is_not_utf8_is_invalid_argument(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    channel = grpc.insecure_channel(server.grpc_target)
    call = channel.unary_unary("/sluice.v1.Throttler/Check")
    for app in (b"\xff", b"\xed\xa0\x80", b"y" * 257):
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x0a" + varint(len(app)) + app, timeout=5)  # field 1 (app), bytes
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (app, e.value)
        assert "app: " in e.value.details(), e.value.details()
    channel.close()
    assert listings_answer(server)["apps"] == []


def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def one_command(command, metric_extra="", policy_extra=""):
    """A throttler (shard main, sampling every 50 ms) over one command probe."""
    return f"""
policies:
  db:
    kind: throttler
    shard: main
    fast_interval: 50ms
    dormant_interval: 50ms{policy_extra}
    metrics:
      probe:
        probe: command
        command: "{command}"{metric_extra}
        threshold: 5
"""


def test_a_probe_error_that_is_not_utf8_is_served_repaired(start_server, tmp_path):
    server = start_server(one_command("printf '\\\\377\\\\376 bytes'"))
    wait_until(lambda: "printed" in server.http("GET", "/throttler/check?app=x").text, 5,
               what="the probe's error in the check")
    r = server.http("GET", "/throttler/check?app=x")
    assert r.status == 429, r
    assert "printed '\ufffd\ufffd'" in r.json()["Message"], r.json()
    listings_answer(server)
    hosts = next(p for p in server.http("GET", "/v1/policies").json()["policies"]
                 if p["name"] == "db")["metrics"][0]["hosts"]
    assert "printed '\ufffd\ufffd'" in hosts[0]["error"], hosts


# A probe that outlives the server's crash: 20 s of timeout, samples fresh for 50 s.
SLOW_PROBE = one_command("sleep 30; echo 1", "\n        timeout: 20s",
                         "\n    stale_intervals: 1000")


def test_a_crashed_server_leaves_no_socket_to_its_probe_child_and_restarts_on_its_ports(
        start_server, tmp_path):
    """A command probe still running when the server dies holds none of its descriptors: the
    ports refuse at once (no connect that hangs to its timeout) and a restart binds them."""
    server = start_server(SLOW_PROBE)
    shells = []
    wait_until(lambda: shells.extend(children(server.proc.pid)) or shells, 5,
               what="the probe's child")
    try:
        server.proc.kill()
        server.proc.wait(5)
        assert all(os.path.exists(f"/proc/{pid}") for pid in shells), "the probe child lives on"
        for port in (server.http_port, server.grpc_port):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
        again = subprocess.Popen([sluice_bin(), "serve", "--grpc", server.grpc_target, "--http",
                                  f"127.0.0.1:{server.http_port}", "--config",
                                  str(server.config_path)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        try:
            wait_until(lambda: healthy(server.http_port) or again.poll() is not None, 10,
                       what="the restart")
            assert again.poll() is None, again.stderr.read().decode(errors="replace")
        finally:
            again.terminate()
            again.wait(10)
    finally:
        for pid in shells:
            try:
                os.killpg(pid, signal.SIGKILL)  # the probe's own process group
            except ProcessLookupError:
                pass


def test_sigterm_with_a_probe_command_running_stops_at_once_and_kills_the_command(
        start_server, tmp_path):
    server = start_server(SLOW_PROBE)
    shells = []
    wait_until(lambda: shells.extend(children(server.proc.pid)) or shells, 5,
               what="the probe's child")
    start = time.monotonic()
    server.signal(signal.SIGTERM)
    assert server.proc.wait(10) == 0
    assert time.monotonic() - start < 2, "SIGTERM waited for the probe's 20 s timeout"
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in shells), 2,
               what="the probe's command to be killed")


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def healthy(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@pytest.mark.parametrize("rule,says", [
    ({"ratio": "half"}, 'ratio: must be a number in (0, 1], not "half"'),
    ({"throttled_until_unix_ms": "soon"}, "throttled_until_unix_ms: must be a whole number"),
    ({"exempt": 1}, "exempt: must be true or false, not 1"),
    ({"metrics": "depth"}, "metrics: must be a list of metric names"),
    ({"thresholds": {"depth": -1}}, "thresholds: must be an object of metric: number > 0"),
    ([1, 2], "the rule: must be an object"),
])
def test_a_state_file_rule_of_the_wrong_type_is_refused_at_start_naming_it(tmp_path, rule, says):
    """Valid JSON whose rule has a field of the wrong type: a clean refusal naming the file, the
    app and the field (it used to stop the server with an uncaught exception)."""
    value = tmp_path / "depth"
    value.write_text("1\n")
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"version": 1, "scopes": {"db": {"gh-ost": rule}}}))
    path = tmp_path / "c.yaml"
    path.write_text(config(value).replace("policies:", f"server:\n  state_file: {state}\npolicies:",
                                          1))
    r = subprocess.run([sluice_bin(), "serve", "--config", str(path), "--grpc", "127.0.0.1:1",
                        "--http", "127.0.0.1:1"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, r.stderr
    assert "terminate" not in r.stderr and "exception" not in r.stderr, r.stderr
    assert f'state file {state}: the rule for app "gh-ost" of scope "db": {says}' in r.stderr, \
        r.stderr


def test_a_burst_of_rule_changes_is_answered_once_written_and_shares_writes(start_server,
                                                                            tmp_path):
    """Rule changes are written off the transport threads: each answer comes once the state
    file holds its change, and concurrent changes share writes."""
    from concurrent.futures import ThreadPoolExecutor

    value = tmp_path / "depth"
    value.write_text("1\n")
    state = tmp_path / "state.json"
    server = start_server(config(value).replace("policies:",
                                                f"server:\n  state_file: {state}\npolicies:", 1))
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(
            lambda i: server.http("GET", f"/throttler/throttle-app?app=burst-{i}&duration=1h")
            .status, range(64)))
    assert statuses == [200] * 64, statuses
    held = json.loads(state.read_text())["scopes"]["db"]
    assert sorted(held) == sorted(f"burst-{i}" for i in range(64)), held
    assert server.http("GET", "/healthz").status == 200
