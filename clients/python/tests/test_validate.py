"""`sluice validate` refuses what `sluice serve` refuses, naming the field: settings the server
would not honour (a second fleet policy on one key, an exempt `all`, bounds a fixed limit
ignores) and what the server checks of its coordinators before connecting (a role the
coordinator's kind cannot hold, a table prefix PostgreSQL cannot take, a conninfo libpq cannot
parse). No database is needed: nothing here connects."""

import subprocess
import textwrap

import pytest

from conftest import free_port, sluice_bin

# Nothing listens there: a coordinator the server would open is refused at once.
NOWHERE = f"host=127.0.0.1 port={free_port()} connect_timeout=2"

CASES = {  # name: (config, validate's error, serve's when it differs)
    "postgres-regional-escrow": (f"""
        coordinators:
          pg: {{kind: postgres, conninfo: "{NOWHERE}"}}
        policies:
          f: {{kind: federated, limit: 100, regional_escrow: pg}}
        """, "policies.f.regional_escrow: coordinator 'pg' is a postgres coordinator, which "
             "cannot hold a regional escrow (the regional pool) (name a memory or redis "
             "coordinator)", None),
    "bad-table-prefix": (f"""
        coordinators:
          pg: {{kind: postgres, conninfo: "{NOWHERE}", table_prefix: Bad-Prefix}}
        policies:
          a: {{kind: fleet, coordinator: pg}}
        """, "coordinators.pg.table_prefix: must match [a-z_][a-z0-9_]* (at most 57 "
             "characters), not 'Bad-Prefix'", None),
    # Fine for the fleet's tables, too long once federation adds "_fed" to it.
    "table-prefix-too-long-for-federation": (f"""
        coordinators:
          pg: {{kind: postgres, conninfo: "{NOWHERE}", table_prefix: {"p" * 52}}}
        policies:
          b: {{kind: federated, coordinator: pg, limit: 10}}
        """, "coordinators.pg: federation's tables (prefix " + "p" * 52 + "_fed, from "
             "table_prefix): postgres: table_prefix must match [a-z_][a-z0-9_]* (at most 55 "
             "characters)",
        "cannot start: policy b: coordinator pg: postgres: table_prefix must match "
        "[a-z_][a-z0-9_]* (at most 55 characters)"),
    "bad-conninfo": ("""
        coordinators:
          pg: {kind: postgres, conninfo: "host=db nonsense"}
        policies:
          a: {kind: fleet, coordinator: pg}
        """, "coordinators.pg: postgres: bad conninfo",
        "cannot start: coordinator pg: postgres: bad conninfo"),
    "two-fleet-policies-one-key": ("""
        policies:
          first: {kind: fleet, key: shared, algorithm: fixed, limit: 4}
          second: {kind: fleet, key: shared, algorithm: fixed, limit: 4}
        """, "policies.second.key: policies first (line 3) and second both join coordinator "
             "'memory' under key 'shared'", None),
    "throttler-exempts-all": ("""
        policies:
          t:
            kind: throttler
            metrics: {load: {probe: loadavg, threshold: 4}}
            apps: {all: {exempt: true}}
        """, "policies.t.apps.all.exempt: does not apply to 'all'", None),
    "fixed-with-adaptive-bounds": ("""
        policies:
          p: {kind: adaptive, algorithm: fixed, limit: 4, min_limit: 100, max_limit: 5}
        """, "policies.p.min_limit: applies to the adaptive algorithms only", None),
    # The defaults (fast_interval 100ms, stale_intervals 5): a sample is stale after 500 ms, so
    # a probe of 1 s would leave every check refused `stale`.
    "throttler-probe-slower-than-its-samples-last": ("""
        policies:
          t:
            kind: throttler
            metrics: {q: {probe: command, command: "echo 1", timeout: 1s, threshold: 4}}
        """, "policies.t.metrics.q.timeout: is 1s, too long to keep samples fresh: a probe may "
             "take max(fast_interval, timeout) + timeout to replace its sample, and a sample is "
             "stale after stale_intervals (5) x fast_interval (100ms) = 500ms; at most 250ms "
             "here, or raise stale_intervals or fast_interval", None),
    "a-period-too-long-to-hold": ("""
        policies:
          r: {kind: rate, limit: 5, period: 99999999999h}
        """, "policies.r.period: is too long to hold: at most 2562047h (about 292 years), not "
             "'99999999999h'", None),
    "throttler-shared-rules-on-no-coordinator": ("""
        policies:
          t:
            kind: throttler
            shared_rules: nope
            metrics: {load: {probe: loadavg, threshold: 4}}
        """, "policies.t.shared_rules: no coordinator named 'nope'", None),
    "throttler-stale-after-one-interval": ("""
        policies:
          t:
            kind: throttler
            stale_intervals: 1
            metrics: {q: {probe: http, url: "http://127.0.0.1:1/q", threshold: 4}}
        """, "policies.t.metrics.q.probe: cannot keep its samples fresh: a probe may take "
             "max(fast_interval, timeout) + timeout to replace its sample, and a sample is "
             "stale after stale_intervals (1) x fast_interval (100ms) = 100ms; raise "
             "stale_intervals above 1", None),
}


def run(*args, timeout=30):
    return subprocess.run([sluice_bin(), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_and_serve_refuse_it_naming_the_field(case, tmp_path):
    """Each case: what validate says, and what serve says when it is not the loader's error
    (None: the same line, from the same loader)."""
    text, wanted, served_wanted = CASES[case]
    config = tmp_path / f"{case}.yaml"
    config.write_text(textwrap.dedent(text))
    out = run("validate", str(config))
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert wanted in out.stderr, out.stderr
    assert "error(s)" in out.stderr
    served = run("serve", "--config", str(config), "--grpc", "127.0.0.1:0", "--http",
                 "127.0.0.1:0")
    assert served.returncode == 1, served.stderr
    assert (served_wanted or wanted) in served.stderr, served.stderr


def test_validate_passes_a_fence_safety_margin_of_zero(tmp_path):
    config = tmp_path / "zero.yaml"
    config.write_text("policies:\n  f: {kind: fleet, fence_safety_margin: 0s}\n")
    out = run("validate", str(config))
    assert out.returncode == 0, out.stderr
    assert "ok (1 policies" in out.stdout


def test_a_config_of_several_yaml_documents_is_refused_naming_the_second(tmp_path):
    config = tmp_path / "two.yaml"
    config.write_text("policies:\n  a: {kind: rate, limit: 5, period: 1s}\n---\n"
                      "policies:\n  b: {kind: rate, limit: 5, period: 1s}\n")
    out = run("validate", str(config))
    assert out.returncode == 1, out.stdout
    assert "two.yaml:3:1: the file holds more than one YAML document; a config is one (the " \
        "second begins here)" in out.stderr, out.stderr
    config.write_text("---\npolicies:\n  a: {kind: rate, limit: 5, period: 1s}\n...\n")
    assert run("validate", str(config)).returncode == 0  # one document, marked as such


def test_a_fifo_or_an_oversized_file_is_refused_as_a_config_without_reading_it(tmp_path):
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    out = run("validate", str(fifo), timeout=10)  # opening it would wait for a writer
    assert out.returncode == 1 and "is not a regular file" in out.stderr, out.stderr
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate((16 << 20) + 1)  # sparse: nothing to write
    out = run("validate", str(big))
    assert out.returncode == 1 and f"is {(16 << 20) + 1} bytes; a config file is at most " \
        "16 MiB" in out.stderr, out.stderr
