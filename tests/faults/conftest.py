"""Session fixtures of the fault suite: one Redis and one PostgreSQL of its own (loopback, free
ports, killed with the test), a network namespace for the packet-loss scenario when the host
allows one, and the results file every scenario adds its figures to.

The sluice binary comes from $SLUICE_BIN; the generated stubs and sluice_client from
PYTHONPATH (as the Python client's own suite). The figures go to $SLUICE_FAULTS_RESULTS
(default: faults-results.md in the working directory) plus a .json beside it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, List

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "clients" / "python"))

import harness  # noqa: E402


def sluice_bin() -> str:
    b = os.environ.get("SLUICE_BIN") or str(REPO / "build" / "dev" / "apps" / "sluice" / "sluice")
    if not os.access(b, os.X_OK):
        pytest.exit(f"sluice binary not found or not executable: {b} (set SLUICE_BIN)", 2)
    return b


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="session")
def netns():
    """(namespace or None, why not)."""
    if os.geteuid() != 0:
        yield None, "needs root (ip netns, nftables)"
        return
    ns = harness.NetNamespace()
    try:
        ns.create()
    except OSError as e:
        ns.destroy()
        yield None, f"cannot build a network namespace with nftables loss: {e}"
        return
    yield ns, ""
    ns.destroy()


@pytest.fixture(scope="session")
def coordinators(workdir, netns) -> Dict[str, harness.Coordinator]:
    ns, _ = netns
    extra = [ns.host_ip] if ns is not None else []
    started: Dict[str, harness.Coordinator] = {}
    try:
        for cls in (harness.RedisCoordinator, harness.PostgresCoordinator):
            c = cls(workdir, extra)
            started[c.kind] = c
            c.start()
        yield started
    finally:
        for c in started.values():
            c.stop()


class Results:
    def __init__(self, path: Path):
        self.path = path
        self.rows: List[dict] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.write()

    def write(self) -> None:
        self.path.with_suffix(".json").write_text(json.dumps(self.rows, indent=1) + "\n")
        lines = ["| scenario | coordinator | outage | bound | L_global | max Σ in-flight | "
                 "max / L_global | samples | over bound | recovery (s) | calls | "
                 "releases ok | leases to expiry | unaccounted | note |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            rec = "—" if r.get("recovery_s") is None else f"{r['recovery_s']:.2f}"
            lines.append(
                f"| {r['scenario']} | {r['coordinator']} | {r['outage']} | {r['bound']} | "
                f"{r['l_global']} | {r['max_in_flight']} | {r['max_ratio']:.2f} | "
                f"{r['samples']} | {r['violations']} | {rec} | {r['calls']} | "
                f"{r['released']} | {r['expired']} | {r['unaccounted']} | {r.get('note', '')} |")
        self.path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def results() -> Results:
    return Results(Path(os.environ.get("SLUICE_FAULTS_RESULTS", "faults-results.md")).resolve())
