"""The throttler kind over HTTP, as the tools that poll one speak to it: the Vitess shape
(/throttler/check, /throttler/check-self; GET with JSON, HEAD with the status alone, as gh-ost's
--throttle-http polls it) and the freno shape (/check/APP/STORE_TYPE/STORE_NAME), over a metric
a command probe reads from a file the test writes."""

import datetime
import re
import shutil
import signal
import subprocess
import time

from conftest import metric, sluice_bin, wait_until


def config(value_file, extra="", metric_extra=""):
    return f"""
policies:
  db:
    kind: throttler
    shard: main
    fast_interval: 50ms
    dormant_interval: 50ms
    stale_intervals: 40
    low_priority_hold: 5s
{extra}
    metrics:
      depth:
        probe: command
        command: "cat {value_file}"
        threshold: 5
{metric_extra}
"""


def check(server, path="/throttler/check?app=gh-ost", method="GET"):
    return server.http(method, path)


def status_of(server, path="/throttler/check?app=gh-ost"):
    return check(server, path).status


def test_under_the_threshold_is_200_and_over_it_429_with_value_and_reason(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1.5\n")
    server = start_server(config(value))
    wait_until(lambda: status_of(server) == 200, 5, what="the first sample")
    r = check(server)
    assert r.status == 200, r
    body = r.json()
    assert body["StatusCode"] == 200
    assert body["AppName"] == "gh-ost"
    assert body["MetricName"] == "depth"
    assert body["Value"] == 1.5 and body["Threshold"] == 5
    assert body["Scope"] == "shard"
    assert body["reason"] == "ok"
    assert body["Metrics"]["depth"]["StatusCode"] == 200

    value.write_text("9\n")
    wait_until(lambda: status_of(server) == 429, 5, what="429 once the value is over")
    body = check(server).json()
    assert body["StatusCode"] == 429
    assert body["reason"] == "threshold_exceeded"
    assert body["value"] == 9 and body["threshold"] == 5
    assert "over its threshold" in body["Message"]

    # HEAD: the status alone (gh-ost throttles on any non-200).
    head = check(server, method="HEAD")
    assert head.status == 429 and head.body == b""
    # The freno shape: the store name is the shard.
    assert status_of(server, "/check/gh-ost/mysql/main") == 429
    assert check(server, "/check/gh-ost/mysql/main").json()["AppName"] == "gh-ost"
    assert status_of(server, "/check/gh-ost/mysql/other") == 404
    assert status_of(server, "/throttler/check?app=gh-ost&shard=main") == 429
    assert status_of(server, "/throttler/check?shard=other") == 404

    # The CLI's table: each metric's worst host against its threshold.
    out = subprocess.run([sluice_bin(), "policies"], capture_output=True, text=True,
                         env={"SLUICE_SERVER": server.grpc_target, "PATH": "/usr/bin:/bin"})
    row = next(line for line in out.stdout.splitlines() if line.startswith("db "))
    assert "throttler" in row and "depth 9/5" in row, out.stdout

    value.write_text("2\n")
    wait_until(lambda: status_of(server) == 200, 5, what="200 once the value is back")

    samples = server.metrics()
    assert metric(samples, "sluice_throttler_checks_total", policy="db", app="gh-ost") >= 4
    assert metric(samples, "sluice_throttler_refused_total", policy="db", app="gh-ost") >= 2
    assert metric(samples, "sluice_throttler_metric_value", policy="db", metric="depth",
                  host="self") == 2
    # Where each app checks from (the host, not the connection's port) and how long ago.
    assert metric(samples, "sluice_throttler_app_client", policy="db", app="gh-ost",
                  client="127.0.0.1") == 1
    assert 0 <= metric(samples, "sluice_throttler_seconds_since_check", policy="db",
                       app="gh-ost") < 60


def test_a_probe_that_fails_counts_as_over_and_says_why(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    wait_until(lambda: status_of(server) == 200, 5, what="the first sample")
    value.unlink()
    wait_until(lambda: status_of(server) == 429, 5, what="fail closed")
    body = check(server).json()
    assert body["reason"] == "probe_failed"
    assert "command exited with 1" in body["Message"], body
    # The failed sample is a missing value, spelled as the exposition format spells it.
    text = server.http("GET", "/metrics").text
    assert re.search(r'^sluice_throttler_metric_value\{[^}]*metric="depth"[^}]*\} NaN$', text,
                     re.M), text
    value.write_text("not-a-number\n")
    wait_until(lambda: "not a number" in check(server).json()["Message"], 5,
               what="a word that is not a number")
    assert status_of(server) == 429


def test_a_command_past_its_timeout_is_killed_and_delays_no_other_metric(start_server,
                                                                        tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(f"""
policies:
  db:
    kind: throttler
    fast_interval: 50ms
    dormant_interval: 50ms
    stale_intervals: 20
    metrics:
      slow:
        probe: command
        command: "sleep 30; echo 1"
        timeout: 500ms
        threshold: 5
      depth:
        probe: command
        command: "cat {value}"
        threshold: 5
    apps:
      quick:
        metrics: [depth]
""")
    wait_until(lambda: "did not finish" in check(server).json()["Message"], 5,
               what="the probe's timeout")
    assert status_of(server) == 429
    # A command past its timeout is killed: only the probe's current attempt is running, never
    # the ones before it (each would otherwise sleep its 30 s).
    time.sleep(2)
    out = subprocess.run(["pgrep", "-P", str(server.proc.pid), "-f", "sleep 30; echo 1"],
                         capture_output=True, text=True)  # this server's children only
    assert len(out.stdout.split()) <= 1, out.stdout
    # The slow probe holds its own loop only: `depth` is sampled every 50 ms meanwhile (its
    # samples would be half a second old and more if they waited behind the 500 ms one).
    for _ in range(10):
        r = check(server, "/throttler/check?app=quick")
        assert r.status == 200, r
        metrics = next(p for p in server.http("GET", "/v1/policies").json()["policies"]
                       if p["name"] == "db")["metrics"]
        depth = next(m for m in metrics if m["name"] == "depth")["hosts"][0]
        assert depth["age_seconds"] < 0.3, metrics
        time.sleep(0.1)
    value.write_text("9\n")
    wait_until(lambda: check(server, "/throttler/check?app=quick").json()["reason"]
               == "threshold_exceeded", 3, what="the fast metric's new value")


def test_app_rules_exempt_and_per_app_thresholds(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("7\n")
    server = start_server(config(value, extra="""
    apps:
      rescue:
        exempt: true
      migrate:
        thresholds: {depth: 10}
"""))
    # 429 for the value itself (before the first sample, "no_sample" is a 429 too).
    wait_until(lambda: check(server, "/throttler/check?app=x").json()["reason"]
               == "threshold_exceeded", 5, what="429 over the threshold")
    r = check(server, "/throttler/check?app=rescue")
    assert r.status == 200 and r.json()["reason"] == "exempt"
    r = check(server, "/throttler/check?app=migrate")
    assert r.status == 200 and r.json()["Threshold"] == 10
    # An app named nowhere gets the default app's name in the answer.
    assert check(server, "/throttler/check").json()["AppName"] == "default"


def test_low_priority_yields_while_a_normal_app_was_refused(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("9\n")
    server = start_server(config(value))
    wait_until(lambda: status_of(server, "/throttler/check?app=ddl") == 429, 5, what="429")
    value.write_text("1\n")
    wait_until(lambda: status_of(server, "/throttler/check?app=web") == 200, 5, what="200")
    r = check(server, "/throttler/check?app=purge&p=low")
    assert r.status == 429 and r.json()["reason"] == "low_priority", r
    assert status_of(server, "/throttler/check?app=purge") == 200


def test_scope_self_and_bad_arguments(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    wait_until(lambda: status_of(server) == 200, 5, what="the first sample")
    body = check(server, "/throttler/check-self?app=a").json()
    assert body["Scope"] == "self" and body["StatusCode"] == 200
    assert check(server, "/throttler/check?scope=self").json()["Scope"] == "self"
    r = check(server, "/throttler/check?scope=cluster")
    assert r.status == 400 and "scope" in r.json()["Message"]
    r = check(server, "/throttler/check?p=urgent")
    assert r.status == 400 and "p:" in r.json()["Message"]
    assert server.http("POST", "/throttler/check").status == 405


def test_the_first_check_after_an_idle_spell_is_not_throttled_by_a_dormant_sample(
        start_server, tmp_path):
    # Dormant every 3 s: the sample from start-up is ~0-3 s old at the first check, stale for
    # the fast interval (2 x 50 ms) but not for the interval it was taken under.
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(f"""
policies:
  db:
    kind: throttler
    fast_interval: 50ms
    dormant_interval: 3s
    idle_after: 10s
    metrics:
      depth:
        probe: command
        command: "cat {value}"
        threshold: 5
""")
    policies = server.http("GET", "/v1/policies").json()["policies"]
    assert next(p for p in policies if p["name"] == "db")["probing"] == "dormant"
    time.sleep(0.5)
    first = check(server)
    assert first.status == 200, first
    # The check sped probing up: a change shows within a few fast intervals, not 3 s.
    value.write_text("9\n")
    started = time.monotonic()
    wait_until(lambda: status_of(server) == 429, 2.5, what="the fast interval")
    assert time.monotonic() - started < 2.0


def test_the_first_check_after_probing_slowed_is_not_throttled_by_the_last_fast_sample(
        start_server, tmp_path):
    # Checks stop; after idle_after probing slows to every 3 s. The last sample was taken under
    # the fast interval (stale after 2 x 50 ms by its own interval), and the next is up to 3 s
    # away: a check in between is judged against the dormant interval now in force.
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(f"""
policies:
  db:
    kind: throttler
    fast_interval: 50ms
    dormant_interval: 3s
    idle_after: 300ms
    stale_intervals: 2
    metrics:
      depth:
        probe: command
        command: "cat {value}"
        threshold: 5
""")
    time.sleep(0.2)
    wait_until(lambda: status_of(server) == 200, 5, what="a first good sample at the fast pace")
    time.sleep(1.0)  # idle: dormant from 300 ms after the last check, the last sample ~0.7 s old

    def probing():
        policies = server.http("GET", "/v1/policies").json()["policies"]
        return next(p for p in policies if p["name"] == "db")["probing"]

    assert probing() == "dormant"
    r = check(server)
    assert r.status == 200, r.json()


UTILISATION = """
policies:
  pool:
    kind: adaptive
    algorithm: fixed
    limit: 2
  db:
    kind: throttler
    fast_interval: 50ms
    dormant_interval: 50ms
    stale_intervals: 40
    metrics:
      pool:
        probe: policy
        policy: pool
        threshold: 0.5
      gone:
        probe: policy
        policy: nowhere
        threshold: 1
    apps:
      batch:
        metrics: [pool]
"""


def test_a_policys_utilisation_is_a_metric(start_server, tmp_path):
    server = start_server(UTILISATION)
    client = server.client()
    wait_until(lambda: status_of(server, "/throttler/check?app=batch") == 200, 5,
               what="the first sample")
    leases = [client.admit("pool") for _ in range(2)]
    wait_until(lambda: status_of(server, "/throttler/check?app=batch") == 429, 5,
               what="429 at full utilisation")
    body = check(server, "/throttler/check?app=batch").json()
    assert body["Value"] == 1.0 and body["MetricName"] == "pool", body
    for lease in leases:
        client.release(lease)
    wait_until(lambda: status_of(server, "/throttler/check?app=batch") == 200, 5,
               what="200 once released")
    # A probe of a policy that does not exist fails closed, saying so.
    body = check(server, "/throttler/check?app=other").json()
    assert body["StatusCode"] == 429 and body["MetricName"] == "gone"
    assert "no policy named 'nowhere'" in body["Message"], body

    # The probe follows reloads: `pool` renamed `nowhere`, the first metric fails closed naming
    # the policy gone, the second sees the one added.
    server.write_config(UTILISATION.replace("  pool:\n    kind: adaptive",
                                            "  nowhere:\n    kind: adaptive"))
    server.signal(signal.SIGHUP)

    def reloaded():
        body = check(server, "/throttler/check?app=other").json()
        return ("no policy named 'pool'" in body["Metrics"]["pool"]["Message"]
                and body["Metrics"]["gone"]["StatusCode"] == 200)
    wait_until(reloaded, 5, what="the probes to see the reload")


def test_config_errors_name_their_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("""
policies:
  db:
    kind: throttler
    metrics:
      depth:
        probe: comand
        threshold: -1
    apps:
      x:
        metrics: [nope]
""")
    out = subprocess.run([sluice_bin(), "validate", str(bad)], capture_output=True,
                         text=True)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "policies.db.metrics.depth.probe" in text, text
    assert "policies.db.metrics.depth.threshold: must be > 0" in text, text
    assert "policies.db.apps.x.metrics" in text and "nope" in text, text
    none = tmp_path / "none.yaml"
    none.write_text("policies:\n  db:\n    kind: throttler\n")
    out = subprocess.run([sluice_bin(), "validate", str(none)], capture_output=True,
                         text=True)
    assert out.returncode != 0 and "policies.db.metrics" in out.stdout + out.stderr


def admin(server, path, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return server.http("POST", path, headers=headers)


def test_throttling_an_app_at_run_time_refuses_it_417_until_unthrottled(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    wait_until(lambda: status_of(server) == 200, 5, what="the first sample")

    r = admin(server, "/throttler/throttle-app?app=gh-ost&duration=1h&ratio=1")
    assert r.status == 200, r
    assert r.json()["rule"]["ratio"] == 1 and r.json()["rule"]["throttled_seconds_left"] > 3500
    r = check(server)
    assert r.status == 417 and r.json()["reason"] == "app_throttled", r
    assert status_of(server, "/throttler/check?app=other") == 200
    listed = server.http("GET", "/throttler/throttled-apps").json()["apps"]
    assert "gh-ost" in listed and listed["gh-ost"]["ratio"] == 1
    # Still obeys the metrics: over the threshold is 429, not 417.
    value.write_text("9\n")
    wait_until(lambda: status_of(server) == 429, 5, what="429 over the threshold")
    value.write_text("1\n")
    wait_until(lambda: status_of(server) == 417, 5, what="417 again")

    assert admin(server, "/throttler/unthrottle-app?app=gh-ost").status == 200
    assert status_of(server) == 200
    assert "gh-ost" not in server.http("GET", "/throttler/throttled-apps").json()["apps"]

    # freno's verbs: /throttle-app/APP/ttl/TTL_MINUTES/ratio/RATIO and /unthrottle-app/APP.
    assert admin(server, "/throttle-app/purge/ttl/10/ratio/1").status == 200
    assert status_of(server, "/check/purge/mysql/main") == 417
    assert admin(server, "/unthrottle-app/purge").status == 200
    assert status_of(server, "/check/purge/mysql/main") == 200
    # Vitess's app names of several ':'-separated parts: a rule on a part applies.
    assert admin(server, "/throttler/throttle-app?app=online-ddl").status == 200
    assert status_of(server, "/throttler/check?app=4b3c:vreplication:online-ddl") == 417
    assert status_of(server, "/throttler/check?app=4b3c:vreplication") == 200
    assert admin(server, "/throttler/unthrottle-app?app=online-ddl").status == 200

    # `all` throttles every app; an exempt app passes anyway.
    assert admin(server, "/throttler/throttle-app?app=all").status == 200
    assert status_of(server, "/throttler/check?app=anyone") == 417
    assert admin(server, "/throttler/exempt-app?app=rescue").status == 200
    r = check(server, "/throttler/check?app=rescue")
    assert r.status == 200 and r.json()["reason"] == "exempt"
    assert admin(server, "/throttler/unthrottle-app?app=all").status == 200

    # A ratio throttles that share of checks.
    assert admin(server, "/throttler/throttle-app?app=half&ratio=0.5").status == 200
    refused = sum(status_of(server, "/throttler/check?app=half") == 417 for _ in range(200))
    assert 60 <= refused <= 140, refused

    # Bad input names the argument and changes nothing.
    for path, word in [("/throttler/throttle-app?app=x&ratio=2", "ratio"),
                       ("/throttler/throttle-app?app=x&duration=soon", "duration"),
                       ("/throttler/throttle-app", "app"),
                       ("/throttle-app/x/ttl/abc", "ttl_minutes"),
                       ("/throttler/exempt-app?app=x&exempt=maybe", "exempt")]:
        r = admin(server, path)
        assert r.status == 400 and word in r.text, (path, r)
    assert "x" not in server.http("GET", "/throttler/throttled-apps").json()["apps"]

    recent = server.http("GET", "/throttler/recent-apps").json()["apps"]
    names = [a["app"] for a in recent]
    assert "half" == names[0] and "gh-ost" in names
    assert next(a for a in recent if a["app"] == "half")["checks"] == 200


def two_stores(value_file):
    """Two throttlers, freno's stores "main" and "replica", over the same metric."""
    store = """
  {name}:
    kind: throttler
    shard: {shard}
    fast_interval: 50ms
    dormant_interval: 50ms
    stale_intervals: 40
    low_priority_hold: 5s
    metrics:
      depth:
        probe: command
        command: "cat {value}"
        threshold: 5
"""
    return ("policies:" + store.format(name="db", shard="main", value=value_file)
            + store.format(name="db2", shard="replica", value=value_file))


def freno_expiry_in(listed, key):
    """Seconds from now to the ExpireAt (RFC 3339, UTC) freno's /throttled-apps lists."""
    at = datetime.datetime.strptime(listed[key]["ExpireAt"], "%Y-%m-%dT%H:%M:%S.%fZ")
    return (at.replace(tzinfo=datetime.timezone.utc)
            - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


def test_freno_routes_as_freno_serves_them(start_server, tmp_path):
    """freno's route grammar and answers (pkg/http/api.go): /throttle-app/APP[/ttl/M][/ratio/R]
    with ?store_name= (none: every store), /unthrottle-app/APP, /throttled-apps,
    /recent-apps[/M], /lb-check, /_ping, /status, /leader-check, ?p=low on the checks."""
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(two_stores(value))
    for store in ("main", "replica"):
        wait_until(lambda: status_of(server, f"/check/gh-ost/mysql/{store}") == 200, 5,
                   what=f"the first sample of {store}")
    ok = b'{"StatusCode":200,"Message":"OK"}\n'
    for path in ("/lb-check", "/_ping", "/status"):
        r = server.http("GET", path)
        assert (r.status, r.body, r.headers["content-type"]) == (200, ok, "application/json"), r
        assert server.http("HEAD", path).status == 200
    r = server.http("GET", "/leader-check")
    assert (r.status, r.body) == (200, b'"HTTP 200"\n'), r

    # No store: every store. The answer is freno's.
    r = admin(server, "/throttle-app/purge/ttl/30/ratio/1")
    assert (r.status, r.body) == (200, ok), r
    for store in ("main", "replica"):
        assert status_of(server, f"/check/purge/mysql/{store}") == 417
    listed = server.http("GET", "/throttled-apps").json()
    assert set(listed) == {"purge/main", "purge/replica"}, listed
    assert listed["purge/main"]["Ratio"] == 1
    assert 29 * 60 < freno_expiry_in(listed, "purge/main") <= 30 * 60
    # No TTL: the longest rule (freno: none); no ratio: the one it has.
    assert admin(server, "/throttle-app/purge/ratio/0.5").status == 200
    listed = server.http("GET", "/throttled-apps").json()
    assert listed["purge/replica"]["Ratio"] == 0.5
    assert freno_expiry_in(listed, "purge/replica") > 365 * 86400
    assert admin(server, "/throttle-app/purge/ttl/10").status == 200
    listed = server.http("GET", "/throttled-apps").json()
    assert listed["purge/main"]["Ratio"] == 0.5
    assert 9 * 60 < freno_expiry_in(listed, "purge/main") <= 10 * 60
    assert admin(server, "/unthrottle-app/purge").status == 200
    assert server.http("GET", "/throttled-apps").json() == {}
    assert status_of(server, "/check/purge/mysql/replica") == 200

    # ?store_name=: that store alone (404 for a store no throttler serves).
    assert admin(server, "/throttle-app/copy/ttl/5?store_name=replica").status == 200
    assert status_of(server, "/check/copy/mysql/replica") == 417
    assert status_of(server, "/check/copy/mysql/main") == 200
    assert admin(server, "/throttle-app/copy?store_name=nowhere").status == 404
    assert admin(server, "/unthrottle-app/copy?store_name=replica").status == 200
    assert status_of(server, "/check/copy/mysql/replica") == 200
    # HEAD changes the rule as GET does (freno registers both); a ratio of 0 lifts it.
    assert server.http("HEAD", "/throttle-app/quiet").status == 200
    assert status_of(server, "/check/quiet/mysql/main") == 417
    assert admin(server, "/throttle-app/quiet/ratio/0").status == 200
    assert status_of(server, "/check/quiet/mysql/main") == 200
    # Bad input is 400 naming it; sluice's earlier grammar is no route.
    for path, word in [("/throttle-app/x/ttl/abc", "ttl_minutes"),
                       ("/throttle-app/x/ratio/1.5", "ratio"),
                       ("/recent-apps/soon", "last_minutes")]:
        r = server.http("GET", path)
        assert r.status == 400 and word in r.text, (path, r)
    assert admin(server, "/throttle-app/x/10/1").status == 404

    # Recent apps: APP/ADDRESS with the time of its last check.
    recent = server.http("GET", "/recent-apps").json()
    entry = recent["gh-ost/127.0.0.1"]
    assert entry["MinutesSinceChecked"] == 0 and abs(entry["CheckedAtEpoch"] - time.time()) < 60
    assert "gh-ost/127.0.0.1" in server.http("GET", "/recent-apps/5").json()

    # ?p=low on freno's checks: low priority yields while a normal app was refused.
    value.write_text("9\n")
    wait_until(lambda: status_of(server, "/check/ddl/mysql/main") == 429, 5, what="429")
    value.write_text("1\n")
    wait_until(lambda: status_of(server, "/check/web/mysql/main") == 200, 5, what="200")
    r = check(server, "/check/purge/mysql/main?p=low")
    assert r.status == 429 and r.json()["reason"] == "low_priority", r
    assert status_of(server, "/check/purge/mysql/main") == 200


def test_freno_skip_host_leaves_a_host_out_of_the_shard_scope(start_server, tmp_path):
    """freno's /skip-host/HOST[/ttl/MINUTES], /recover-host/HOST and /skipped-hosts: a skipped
    host's samples are left out of the shard scope (here the command probe's only host, "self":
    every host skipped counts as over), never out of the self scope."""
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    wait_until(lambda: status_of(server) == 200, 5, what="the first sample")
    r = admin(server, "/skip-host/self/ttl/5")
    assert (r.status, r.body) == (200, b'{"StatusCode":200,"Message":"OK"}\n'), r
    skipped = server.http("GET", "/skipped-hosts").json()
    assert set(skipped) == {"self"}, skipped
    at = datetime.datetime.strptime(skipped["self"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc)
    left = (at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    assert 4 * 60 < left <= 5 * 60, left
    r = check(server)
    assert r.status == 429 and r.json()["reason"] == "no_sample", r
    assert "every host of metric depth is skipped" in r.json()["Message"], r
    assert status_of(server, "/throttler/check-self?app=gh-ost") == 200  # self is self
    assert admin(server, "/recover-host/self").status == 200
    assert server.http("GET", "/skipped-hosts").json() == {}
    assert status_of(server) == 200
    # No TTL: an hour, as freno's; bad input names it.
    assert admin(server, "/skip-host/self").status == 200
    at = datetime.datetime.strptime(server.http("GET", "/skipped-hosts").json()["self"],
                                    "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    assert 59 * 60 < (at - datetime.datetime.now(datetime.timezone.utc)).total_seconds() <= 3600
    r = admin(server, "/skip-host/self/ttl/soon")
    assert r.status == 400 and "ttl_minutes" in r.text, r
    assert admin(server, "/recover-host/self").status == 200


def test_admin_verbs_need_the_token_when_one_is_set(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    with_token = "server:\n  admin_token: s3cret\npolicies:"
    server = start_server(config(value).replace("policies:", with_token, 1))
    for path in ["/throttler/throttle-app?app=a", "/throttler/unthrottle-app?app=a",
                 "/throttler/exempt-app?app=a", "/throttle-app/a/ttl/10/ratio/1",
                 "/unthrottle-app/a"]:
        r = admin(server, path)
        assert r.status == 401, (path, r)
        assert admin(server, path, token="wrong").status == 401
    assert admin(server, "/throttler/throttle-app?app=a", token="s3cret").status == 200
    # Checking needs no token.
    wait_until(lambda: status_of(server, "/throttler/check?app=a") == 417, 5, what="417")


def test_rules_set_at_run_time_survive_a_restart(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    state = tmp_path / "state.json"
    text = config(value).replace("policies:", f"server:\n  state_file: {state}\npolicies:", 1)
    server = start_server(text)
    assert admin(server, "/throttler/throttle-app?app=migrate&duration=1h").status == 200
    assert admin(server, "/throttler/exempt-app?app=rescue").status == 200
    assert admin(server, "/throttler/throttle-app?app=brief&duration=500ms").status == 200
    assert "brief" in state.read_text()
    server.stop()
    time.sleep(0.6)  # brief's throttle runs out while the server is down
    again = start_server(text)
    wait_until(lambda: status_of(again, "/throttler/check?app=other") == 200, 5,
               what="the first sample")
    assert status_of(again, "/throttler/check?app=migrate") == 417
    value.write_text("9\n")
    wait_until(lambda: status_of(again, "/throttler/check?app=other") == 429, 5, what="429")
    assert status_of(again, "/throttler/check?app=rescue") == 200
    apps = again.http("GET", "/throttler/throttled-apps").json()["apps"]
    assert 3000 < apps["migrate"]["throttled_seconds_left"] <= 3600
    assert apps["rescue"]["exempt"] is True
    # A throttle that ran out while the server was down is gone, from the file too.
    assert "brief" not in apps and "brief" not in state.read_text()


def test_a_rule_the_state_file_cannot_hold_is_503_and_not_applied(start_server, tmp_path):
    """A state file that cannot be written (here its directory is gone: tests run as root, so a
    permission cannot be taken away) is the server's trouble: 503 naming the file and why, and
    the rule takes no effect; the server keeps serving checks."""
    value = tmp_path / "depth"
    value.write_text("1\n")
    home = tmp_path / "state"
    home.mkdir()
    state = home / "state.json"
    text = config(value).replace("policies:", f"server:\n  state_file: {state}\npolicies:", 1)
    server = start_server(text)
    wait_until(lambda: status_of(server) == 200, 5, what="the first sample")
    assert admin(server, "/throttler/throttle-app?app=kept&duration=1h").status == 200
    shutil.rmtree(home)
    for path in ("/throttler/throttle-app?app=lost&duration=1h", "/throttle-app/lost"):
        r = admin(server, path)
        assert r.status == 503, (path, r)
        assert str(state) in r.text, r.text
    assert status_of(server, "/throttler/check?app=lost") == 200
    assert status_of(server, "/throttler/check?app=kept") == 417


def test_the_default_configs_throttler_answers_its_first_check_from_good_samples(server):
    # Its `search` metric reads a policy that the engine publishes only after building the
    # throttler, whose probes start at once: until the first publish a failed sample is retried
    # every millisecond, so the very first check (as soon as the server answers) sees a good one.
    r = check(server, "/throttler/check?app=demo")
    body = r.json()
    assert body["Metrics"]["search"]["StatusCode"] == 200, body
    assert body["Metrics"]["search"]["Value"] == 0
    assert body["Metrics"]["load"]["reason"] in ("ok", "threshold_exceeded"), body
