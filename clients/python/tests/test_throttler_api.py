"""The throttler beyond the Vitess shape: the same check over gRPC (sluice.v1.Throttler/Check),
freno's check-read (the reader's own threshold) and -if-exists checks, the HTTP URL probe, and
the config errors of the network probes."""

import http.server
import json
import socket
import subprocess
import threading
import time
import urllib.parse

import grpc
import pytest

from conftest import metric, sluice_bin, wait_until
from test_throttler import config  # the same throttler: metric depth from a file, shard main


def test_the_grpc_check_answers_as_the_http_check_does(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("3\n")
    server = start_server(config(value))
    wait_until(lambda: server.http("GET", "/throttler/check?app=x").status == 200, 5,
               what="the first sample")
    with server.client() as c:
        r = c.throttler_check("purge")
        assert r.ok and r.status == 200 and r.reason == "ok", r
        assert r.value == 3 and r.threshold == 5 and r.metric == "depth"
        assert c.throttler_check("purge", shard="main", scope="self").ok
        # The reader's own threshold, as check-read: under 3 the same sample is over.
        low = c.throttler_check("purge", threshold=2)
        assert low.status == 429 and low.reason == "threshold_exceeded" and low.threshold == 2
        with pytest.raises(Exception) as e:
            c.throttler_check("purge", shard="nope")
        assert "no throttler serves shard 'nope'" in str(e.value)
        with pytest.raises(Exception) as e:
            c.throttler_check("purge", scope="galaxy")
        assert "scope" in str(e.value)
    # The same in the audit: gRPC checks are counted as the app's.
    apps = server.http("GET", "/throttler/recent-apps").json()["apps"]
    assert any(a["app"] == "purge" and a["checks"] >= 3 for a in apps), apps

    value.write_text("7\n")
    wait_until(lambda: server.http("GET", "/throttler/check?app=x").status == 429, 5,
               what="429 once over")
    with server.client() as c:
        r = c.throttler_check("purge")
        assert not r.ok and r.status == 429 and r.value == 7, r


def test_a_malformed_grpc_request_is_invalid_argument(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    channel = grpc.insecure_channel(server.grpc_target)
    call = channel.unary_unary("/sluice.v1.Throttler/Check")
    for bad in (b"\x0a\x05ab", b"\x08\x01", b"\xff"):  # truncated; app as a varint; bad key
        with pytest.raises(grpc.RpcError) as e:
            call(bad, timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad, e.value)
    channel.close()


def test_freno_check_read_and_if_exists(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("3\n")
    server = start_server(config(value))
    wait_until(lambda: server.http("HEAD", "/check/a/mysql/main").status == 200, 5,
               what="the first sample")
    assert server.http("HEAD", "/check-read/a/mysql/main/10").status == 200
    r = server.http("GET", "/check-read/a/mysql/main/2.5")
    assert r.status == 429 and r.json()["Threshold"] == 2.5, r
    assert server.http("HEAD", "/check-read/a/mysql/main/abc").status == 400
    assert server.http("HEAD", "/check-read/a/mysql/main/0").status == 400
    # An unknown store: 404, and 200 for the -if-exists forms.
    assert server.http("HEAD", "/check/a/mysql/other").status == 404
    assert server.http("HEAD", "/check-if-exists/a/mysql/other").status == 200
    assert server.http("HEAD", "/check-read-if-exists/a/mysql/other/1").status == 200
    # A known one is checked as usual by them.
    assert server.http("HEAD", "/check-read-if-exists/a/mysql/main/1").status == 429
    assert server.http("HEAD", "/check-if-exists/a/mysql/main").status == 200


class _NumberServer:
    """An HTTP server on loopback whose GET /n answers `self.body` with `self.status`."""

    def __init__(self):
        self.body, self.status = b"12.5\n", 200
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/n":
                    self.send_error(404)
                    return
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_http_probe_reads_a_number_from_a_url_and_fails_closed(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    web = _NumberServer()
    try:
        server = start_server(config(value, metric_extra=f"""
      queue:
        probe: http
        url: http://127.0.0.1:{web.port}/n
        timeout: 500ms
        threshold: 20
"""))

        def queue():
            return server.http("GET", "/throttler/check?app=x").json()["Metrics"]["queue"]

        wait_until(lambda: queue()["StatusCode"] == 200, 5, what="the URL's first sample")
        assert queue()["Value"] == 12.5
        web.body = b"25 jobs\n"
        wait_until(lambda: queue()["Value"] == 25, 5, what="the new value")
        assert server.http("HEAD", "/throttler/check?app=x").status == 429
        web.body, web.status = b"oops", 200
        wait_until(lambda: queue()["reason"] == "probe_failed", 5, what="a body with no number")
        assert "not a number" in queue()["Message"], queue()
        web.body, web.status = b"3", 503
        wait_until(lambda: "answered 503" in queue()["Message"], 5, what="a 503")
        assert server.http("HEAD", "/throttler/check?app=x").status == 429
        web.status = 200
        wait_until(lambda: queue()["StatusCode"] == 200, 5, what="recovery")
    finally:
        web.close()
    wait_until(lambda: "cannot connect" in queue()["Message"], 5, what="the URL gone")
    assert queue()["reason"] == "probe_failed"


def test_network_probe_config_errors_name_their_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("""
policies:
  db:
    kind: throttler
    metrics:
      lag:
        probe: mysql_lag
        hosts: ["10.0.0.1:99999", "[::1"]
        command: "echo 1"
        threshold: 1
      pg:
        probe: postgres_lag
        conninfo: "postgresql://u@h/db"
        threshold: 1
      beat:
        probe: mysql_heartbeat
        hosts: [db]
        user: t
        heartbeat_table: "meta.heart beat"
        password: x
        password_env: SLUICE_TEST_NO_SUCH_VARIABLE
        threshold: 1
      web:
        probe: http
        url: https://example.com/n
        threshold: 1
      cache:
        probe: redis
        hosts: [127.0.0.1]
        threshold: 1
""")
    out = subprocess.run([sluice_bin(), "validate", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    for expected in (
            "policies.db.metrics.lag.hosts: '10.0.0.1:99999': the port must be 1..65535",
            "policies.db.metrics.lag.hosts: '[::1': an unclosed '['",
            "policies.db.metrics.lag.command: is not a setting of probe: mysql_lag",
            "policies.db.metrics.lag.user",
            "policies.db.metrics.pg.hosts: is required",
            "policies.db.metrics.pg.conninfo: must be keyword=value pairs",
            "policies.db.metrics.beat.heartbeat_table: must be [database.]table",
            "policies.db.metrics.beat.password_env: give password or password_env, not both",
            "policies.db.metrics.web.url: must start with http://",
            "policies.db.metrics.cache.field"):
        assert expected in text, (expected, text)


def cli(server, *args, token=None, timeout=30):
    env = {"SLUICE_HTTP": f"http://127.0.0.1:{server.http_port}", "PATH": "/usr/bin:/bin"}
    if token:
        env["SLUICE_ADMIN_TOKEN"] = token
    return subprocess.run([sluice_bin(), "throttler", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_the_cli_checks_waits_and_sets_rules(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("3\n")
    server = start_server(config(value) + "\nserver:\n  admin_token: s3cret\n")
    wait_until(lambda: server.http("GET", "/throttler/check?app=x").status == 200, 5,
               what="the first sample")
    out = cli(server, "check", "purge")
    assert out.returncode == 0 and "allowed (200): ok, depth 3 (threshold 5)" in out.stdout, out
    out = cli(server, "check", "purge", "--json")
    assert out.returncode == 0, out
    assert '"metric":"depth"' in out.stdout and '"ok":true' in out.stdout, out

    # Admin verbs need the token.
    out = cli(server, "throttle", "purge", "--duration", "1h")
    assert out.returncode == 2 and "401" in out.stderr, out
    out = cli(server, "throttle", "purge", "--duration", "1h", "--ratio", "2", token="s3cret")
    assert out.returncode == 2 and "ratio: must be a number in (0, 1]" in out.stderr, out
    out = cli(server, "throttle", "purge", "--duration", "1h", token="s3cret")
    assert out.returncode == 0 and "throttled_seconds_left" in out.stdout, out
    out = cli(server, "check", "purge")
    assert out.returncode == 1 and "refused (417): app_throttled" in out.stdout, out
    out = cli(server, "apps")
    assert out.returncode == 0, out
    assert "purge" in out.stdout.split("apps that checked")[0], out  # its rule
    assert "checks" in out.stdout.split("apps that checked")[1], out

    # --wait backs off until allowed: unthrottled 1.5 s into the wait.
    waiting = subprocess.Popen(
        [sluice_bin(), "throttler", "check", "purge", "--wait", "20s", "--http",
         f"http://127.0.0.1:{server.http_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert cli(server, "unthrottle", "purge", token="s3cret").returncode == 0
    stdout, stderr = waiting.communicate(timeout=30)
    assert waiting.returncode == 0 and "allowed (200)" in stdout, (stdout, stderr)
    assert "checking again in" in stderr, stderr

    # A wait that runs out is a refusal (1); errors are 2.
    value.write_text("9\n")
    wait_until(lambda: server.http("GET", "/throttler/check?app=x").status == 429, 5,
               what="429 once over")
    out = cli(server, "check", "purge", "--wait", "1500ms")
    assert out.returncode == 1 and "threshold_exceeded" in out.stdout, out
    out = cli(server, "check", "purge", "--shard", "nope")
    assert out.returncode == 2 and "no throttler serves shard 'nope'" in out.stdout, out
    out = cli(server, "check", "purge", "--http", "http://127.0.0.1:1")
    assert out.returncode == 2 and "unreachable" in out.stdout, out


def test_load_that_no_refused_check_explains_is_signalled(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("9\n")  # over the threshold from the start, and nobody checks
    server = start_server(config(value).replace("stale_intervals: 40",
                                                "stale_intervals: 40\n    unexplained_after: 400ms"))

    def gauge():
        return metric(server.metrics(), "sluice_throttler_unexplained_load", metric="depth")

    wait_until(lambda: gauge() == 1, 5, what="the unexplained-load signal")
    audit = server.http("GET", "/throttler/recent-apps").json()["unexplained_load"]["depth"]
    assert audit["now"] is True and audit["episodes"] == 1, audit
    # A compliant app asks and is held back: the load is explained while it keeps asking.
    assert server.http("HEAD", "/throttler/check?app=purge").status == 429
    wait_until(lambda: gauge() == 0, 5, what="the signal cleared by a refused check")
    # It stops asking (checks stopped while the load stays up): the signal comes back.
    wait_until(lambda: gauge() == 1, 5, what="the signal after checks stopped")
    def audit():
        return server.http("GET", "/throttler/recent-apps").json()["unexplained_load"]["depth"]

    wait_until(lambda: audit()["seconds"] > 0, 5, what="unexplained time counted")
    assert audit()["episodes"] == 2, audit()
    assert metric(server.metrics(), "sluice_throttler_unexplained_load_seconds_total",
                  metric="depth") > 0
    # Under the threshold there is nothing to explain.
    value.write_text("1\n")
    wait_until(lambda: gauge() == 0, 5, what="the signal gone under the threshold")


class _RawConnection:
    """One kept-alive TCP connection that writes requests byte for byte as a client would and
    parses each answer strictly: status line, headers, then exactly Content-Length bytes of body
    (none for HEAD), so a stray byte would corrupt the next answer."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            assert chunk, "the server closed the kept-alive connection"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode()

    def request(self, raw: bytes, head: bool):
        self.sock.sendall(raw)
        status_line = self._line()
        version, status, _ = status_line.split(" ", 2)
        assert version == "HTTP/1.1", status_line
        headers = {}
        while True:
            line = self._line()
            if not line:
                break
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        body = b""
        if not head:
            while len(self.buf) < length:
                chunk = self.sock.recv(4096)
                assert chunk
                self.buf += chunk
            body, self.buf = self.buf[:length], self.buf[length:]
        return int(status), headers, body

    def close(self):
        self.sock.close()


def test_the_wire_as_gh_ost_and_a_freno_client_speak_it(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("3\n")
    server = start_server(config(value))
    wait_until(lambda: server.http("HEAD", "/throttler/check?app=gh-ost").status == 200, 5,
               what="the first sample")
    host = f"127.0.0.1:{server.http_port}".encode()
    # gh-ost --throttle-http: HEAD every 100 ms on one kept-alive connection (Go's client);
    # any status but 200 throttles the migration.
    ghost = (b"HEAD /throttler/check?app=gh-ost HTTP/1.1\r\nHost: " + host +
             b"\r\nUser-Agent: Go-http-client/1.1\r\n\r\n")
    conn = _RawConnection(server.http_port)
    try:
        for _ in range(5):
            status, headers, _ = conn.request(ghost, head=True)
            assert status == 200, headers
        value.write_text("8\n")
        wait_until(lambda: conn.request(ghost, head=True)[0] != 200, 5,
                   what="gh-ost sees non-200")
        assert conn.request(ghost, head=True)[0] == 429
        assert conn.buf == b"", conn.buf  # no body followed any HEAD answer

        # A freno client: GET /check/APP/STORE_TYPE/STORE_NAME, JSON with freno's fields, on
        # the same connection.
        status, headers, body = conn.request(
            b"GET /check/archive/mysql/main HTTP/1.1\r\nHost: " + host +
            b"\r\nAccept: application/json\r\n\r\n", head=False)
        assert status == 429
        assert headers["content-type"].startswith("application/json"), headers
        doc = json.loads(body)
        for field in ("StatusCode", "Value", "Threshold", "Message", "RecentlyChecked"):
            assert field in doc, (field, doc)
        assert doc["StatusCode"] == 429 and doc["Value"] == 8 and doc["Threshold"] == 5, doc
        assert doc["RecentlyChecked"] is True, doc  # gh-ost checked a moment ago
        value.write_text("1\n")
        wait_until(lambda: conn.request(ghost, head=True)[0] == 200, 5, what="200 again")
        status, _, body = conn.request(
            b"HEAD /check/archive/mysql/main HTTP/1.1\r\nHost: " + host + b"\r\n\r\n", head=True)
        assert status == 200 and conn.buf == b""
        # The JSON holds any app name (quotes, backslashes, control characters, UTF-8), and a
        # HEAD's Content-Length is its GET's.
        weird = 'we"ird\\app\n\u00e9'
        quoted = urllib.parse.quote(weird)
        status, headers, body = conn.request(
            f"GET /throttler/check?app={quoted} HTTP/1.1\r\nHost: ".encode() + host +
            b"\r\n\r\n", head=False)
        assert json.loads(body)["AppName"] == weird, body
        _, head_headers, _ = conn.request(
            f"HEAD /throttler/check?app={quoted} HTTP/1.1\r\nHost: ".encode() + host +
            b"\r\n\r\n", head=True)
        assert head_headers.get("content-length") == headers["content-length"], head_headers
    finally:
        conn.close()


def test_an_apps_metric_set_and_thresholds_set_at_run_time_survive_a_restart(start_server,
                                                                              tmp_path):
    depth, queue = tmp_path / "depth", tmp_path / "queue"
    depth.write_text("3\n")
    queue.write_text("50\n")
    state = tmp_path / "state.json"
    text = config(depth, metric_extra=f"""
      queue:
        probe: command
        command: "cat {queue}"
        threshold: 10
""") + f"\nserver:\n  admin_token: s3cret\n  state_file: {state}\n"
    server = start_server(text)

    def status(app):
        return server.http("GET", f"/throttler/check?app={app}").status

    wait_until(lambda: server.http("GET", "/throttler/check?app=purge").json()["reason"]
               == "threshold_exceeded", 5, what="queue over its threshold")
    # purge checks depth alone; backfill gets its own queue threshold; through the CLI.
    out = cli(server, "rule", "purge", "--metrics", "depth", token="s3cret")
    assert out.returncode == 0 and '"metrics":["depth"]' in out.stdout, out
    out = cli(server, "rule", "backfill", "--threshold", "queue=100", token="s3cret")
    assert out.returncode == 0 and '"thresholds":{"queue":100' in out.stdout, out
    assert status("purge") == 200 and status("backfill") == 200 and status("other") == 429
    # Bad input names what was wrong and changes nothing.
    out = cli(server, "rule", "purge", "--metrics", "depth,nope", token="s3cret")
    assert out.returncode == 2 and "'nope' is not one of the throttler's metrics" in out.stderr
    out = cli(server, "rule", "purge", "--threshold", "depth=x", token="s3cret")
    assert out.returncode == 2 and "thresholds: expected metric:number pairs" in out.stderr
    out = cli(server, "rule", "purge", "--threshold", "depth")
    assert out.returncode == 2 and "expected METRIC=NUMBER" in out.stderr
    assert server.http("POST", "/throttler/app-rule?app=purge&metrics=depth").status == 401
    assert status("purge") == 200

    server.stop()
    again = start_server(text)
    # Before the first samples every check is a 429 (no_sample): wait for both metrics.
    wait_until(lambda: all(m["reason"] != "no_sample" for m in again.http(
        "GET", "/throttler/check?app=other").json()["Metrics"].values()), 5,
        what="the first samples after the restart")
    assert again.http("GET", "/throttler/check?app=other").status == 429
    assert again.http("GET", "/throttler/check?app=purge").status == 200
    assert again.http("GET", "/throttler/check?app=backfill").status == 200
    rules = again.http("GET", "/throttler/throttled-apps").json()["apps"]
    assert rules["purge"]["metrics"] == ["depth"] and rules["backfill"]["thresholds"] == {
        "queue": 100}, rules
    # Dropped again: the defaults.
    assert cli(again, "rule", "purge", "--clear", token="s3cret").returncode == 0
    assert again.http("GET", "/throttler/check?app=purge").status == 429
    assert "purge" not in state.read_text() and "backfill" in state.read_text()


def test_vitess_clients_get_the_response_code_and_the_status_page(start_server, tmp_path):
    """Vitess's newer check answer carries `ResponseCode` (CheckThrottlerResponseCode: OK 1,
    THRESHOLD_EXCEEDED 2, APP_DENIED 3, INTERNAL_ERROR 5), top level and per metric, beside
    freno's `StatusCode`; /throttler/status answers with ThrottlerStatus's field names and types."""
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    wait_until(lambda: server.http("GET", "/throttler/check?app=a").status == 200, 5,
               what="the first sample")

    def checked(app):
        r = server.http("GET", f"/throttler/check?app={app}")
        body = r.json()
        assert body["StatusCode"] == r.status, body
        return body

    ok = checked("online-ddl")
    assert ok["ResponseCode"] == 1 and ok["Metrics"]["depth"]["ResponseCode"] == 1, ok
    value.write_text("9\n")
    over = wait_until(lambda: (b := checked("online-ddl"))["StatusCode"] == 429 and b, 5,
                      what="the metric over its threshold")
    assert over["ResponseCode"] == 2 and over["Metrics"]["depth"]["ResponseCode"] == 2, over
    value.write_text("1\n")
    wait_until(lambda: checked("online-ddl")["StatusCode"] == 200, 5, what="under again")
    assert server.http("GET", "/throttler/throttle-app?app=purge&duration=1h&ratio=1").status == 200
    denied = checked("purge")
    assert (denied["StatusCode"], denied["ResponseCode"]) == (417, 3), denied
    assert server.http("GET", "/throttler/exempt-app?app=backup").status == 200

    status = server.http("GET", "/throttler/status")
    assert status.status == 200, status.text()
    s = status.json()
    types = {"Keyspace": str, "Shard": str, "IsLeader": bool, "IsOpen": bool, "IsEnabled": bool,
             "IsDormant": bool, "RecentlyChecked": bool, "Query": str, "CustomQuery": str,
             "Threshold": (int, float), "MetricNameUsedAsDefault": str,
             "AggregatedMetrics": dict, "MetricsThresholds": dict, "MetricsHealth": dict,
             "ThrottledApps": list, "AppCheckedMetrics": dict, "RecentApps": dict}
    assert set(s) == set(types), sorted(s)
    for field, kind in types.items():
        assert isinstance(s[field], kind), (field, s[field])
    assert s["Shard"] == "main" and s["IsLeader"] and s["IsOpen"] and s["IsEnabled"], s
    assert s["RecentlyChecked"] is True and s["IsDormant"] is False, s
    assert s["Threshold"] == 5 and s["MetricNameUsedAsDefault"] == "depth", s
    assert s["MetricsThresholds"] == {"depth": 5, "default": 5}, s
    assert s["AggregatedMetrics"]["shard/depth"] == {"Value": 1}, s["AggregatedMetrics"]
    assert s["AggregatedMetrics"]["self"] == {"Value": 1}, s["AggregatedMetrics"]
    health = s["MetricsHealth"]["depth"]
    assert health["SecondsSinceLastHealthy"] == 0 and health["LastHealthyAt"].endswith("Z"), s
    apps = {a["AppName"]: a for a in s["ThrottledApps"]}
    assert set(apps) == {"purge", "backup"}, apps
    assert apps["purge"]["Ratio"] == 1 and apps["purge"]["Exempt"] is False, apps
    assert apps["backup"]["Exempt"] is True and apps["backup"]["Ratio"] == 0, apps
    recent = s["RecentApps"]["purge"]
    assert recent == {"AppName": "purge", "CheckedAt": recent["CheckedAt"], "StatusCode": 417,
                      "ResponseCode": 3}, recent
    assert server.http("HEAD", "/throttler/status").status == 200
    assert server.http("GET", "/throttler/status?shard=nope").status == 404

    # A metric that cannot be read: 429 (every client backs off), INTERNAL_ERROR for Vitess.
    value.unlink()
    failed = wait_until(lambda: (b := checked("online-ddl"))["ResponseCode"] == 5 and b, 5,
                        what="the probe to fail")
    assert failed["StatusCode"] == 429, failed
    agg = server.http("GET", "/throttler/status").json()["AggregatedMetrics"]["shard/depth"]
    assert set(agg) == {"Error"}, agg
