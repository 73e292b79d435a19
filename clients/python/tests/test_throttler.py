"""The throttler kind over HTTP, as the tools that poll one speak to it: the Vitess shape
(/throttler/check, /throttler/check-self; GET with JSON, HEAD with the status alone, as gh-ost's
--throttle-http polls it) and the freno shape (/check/APP/STORE_TYPE/STORE_NAME), over a metric
a command probe reads from a file the test writes."""

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


def test_a_probe_that_fails_counts_as_over_and_says_why(start_server, tmp_path):
    value = tmp_path / "depth"
    value.write_text("1\n")
    server = start_server(config(value))
    assert status_of(server) == 200
    value.unlink()
    wait_until(lambda: status_of(server) == 429, 5, what="fail closed")
    body = check(server).json()
    assert body["reason"] == "probe_failed"
    assert "command exited with 1" in body["Message"], body
    value.write_text("not-a-number\n")
    wait_until(lambda: "not a number" in check(server).json()["Message"], 5,
               what="a word that is not a number")
    assert status_of(server) == 429


def test_a_command_past_its_timeout_is_killed_and_counts_as_over(start_server, tmp_path):
    server = start_server(f"""
policies:
  db:
    kind: throttler
    fast_interval: 50ms
    dormant_interval: 50ms
    metrics:
      slow:
        probe: command
        command: "sleep 30; echo 1"
        timeout: 200ms
        threshold: 5
""")
    wait_until(lambda: "did not finish" in check(server).json()["Message"], 5,
               what="the probe's timeout")
    assert status_of(server) == 429
    # The killed command is not left running.
    out = subprocess.run(["pgrep", "-f", "sleep 30; echo 1"], capture_output=True, text=True)
    assert out.stdout.strip() == "", out.stdout


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
    wait_until(lambda: status_of(server, "/throttler/check?app=x") == 429, 5, what="429")
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
    assert status_of(server, "/throttler/check?app=batch") == 200
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
