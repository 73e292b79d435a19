"""Federation as real processes: three `sluice serve` (one per region) split one global rate
budget through one real coordinator, driven over gRPC, with the bound checked in every
coordinator window, steady and through coordinator faults. Every scenario runs once per
coordinator backend:

- `redis`: a Redis of this module's own, no persistence, so a restart comes back empty;
- `postgres`: a PostgreSQL of this module's own (initdb into a temporary directory) with
  synchronous_commit off server-wide; the coordinator turns it on for its own transactions, so
  a SIGKILL + restart keeps every grant it acknowledged.

Setup: three servers, each with a `federated` policy on the same budget and its own region,
limit LIMIT per WINDOW, batch BATCH, lease_timeout 250 ms, retry_backoff 1 s, fail-closed; a
load generator of two threads per region calling Check over gRPC on one hot key, paced at
OFFERED x the limit's rate in total, split among the regions by a skew (uniform, or all of it on
one region).

Windows are on the coordinator's clock (Redis TIME, PostgreSQL clock_timestamp()), aligned on
multiples of WINDOW since the Unix epoch; the test runs on the same machine, so each call is
attributed by the wall clock. A decision falls between a call's send and its answer: widened by
GUARD on both sides, an admission whose interval lies in one window counts there ("definite");
one that straddles a boundary counts in every window it touches ("upper", which can only over-
count). The bound checked: upper <= LIMIT in every window. U_capacity = admitted / min(offered,
LIMIT) over the full windows of steady load.

A fresh coordinator counts the window it finds its storage empty in as spent for every key
(reason coordinator_restarted), so the first window of load is never measured. A PostgreSQL
that restarts with its tables intact has not lost its state and says nothing of the kind.

A part on partial losses: a coordinator that comes back behind what it granted, each on a
coordinator of the scenario's own (for PostgreSQL, a standby of the module's): a Redis
restarted from an RDB snapshot or from a truncated AOF taken mid-window, a Redis whose ledger
is evicted under a maxmemory-policy changed at run time, and a failover to a Redis replica or a
PostgreSQL standby that missed the last grants. The window of the loss must count as spent
(coordinator_restarted) once the regions reach the coordinator again. And a failover that
Redis Sentinel makes after a SIGKILL of the primary, the regions naming the sentinels.

And on a 3-member etcd cluster of the scenario's own, its leader cut off from its peers (its
member in a network namespace, as in the fleet's scenario 12) while a region still talks to it.

A second part, against Redis only: one region run as POOL_PROCESSES processes sharing a
regional pool on a Redis of its own (the global coordinator another Redis), steady, with the
pool's Redis killed, and with the coordinator stopped in either outage mode of the pooled
region (regional-only: the pool's balance serves past its window; fail-closed: it does not).

Figures go to $SLUICE_FEDERATION_RESULTS (default federation-results.md in the working
directory) plus a .json beside it.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

import harness
from conftest import sluice_bin
from harness import (CheckLoad, FederatedNode, FederationConfig, least_assignment, per_window,
                     window_of)

LIMIT = 300
WINDOW = 2.0
BATCH = 16
REGIONS = ["us-east", "eu-west", "ap-south"]
OFFERED = 1.5  # the load, as a multiple of LIMIT per WINDOW
GUARD = 0.02  # seconds: how far from a boundary an answer must be to count as inside a window
STEADY_WINDOWS = 3
# The most a window can lose to escrow: every other region holding a batch it cannot spend
# before the window ends (its load stopped, or the budget ran out at the coordinator first).
U_FLOOR = 1 - (len(REGIONS) - 1) * BATCH / LIMIT
SKEWS = {"uniform": [1.0, 1.0, 1.0], "one-region": [1.0, 0.0, 0.0]}
BACKENDS = ["redis", "postgres"]
WINDOW_NS = int(WINDOW * 1e9)


@pytest.fixture(scope="module", params=BACKENDS)
def coord(request, tmp_path_factory) -> harness.Coordinator:
    """The coordinator every region of a scenario shares, one per backend (the scenarios run
    on one, then on the other)."""
    d = tmp_path_factory.mktemp(f"federation-{request.param}")
    c = (harness.RedisCoordinator(d) if request.param == "redis"
         # The server's default off, as in the fleet suite: the federation coordinator sets
         # synchronous_commit on for its own transactions, which the restart scenario shows.
         else harness.PostgresCoordinator(d, synchronous_commit="off", durable_commits=True))
    try:
        c.start()
        yield c
    finally:
        c.stop()


class FederationResults:
    def __init__(self, path: Path):
        self.path = path
        self.rows: List[dict] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.path.with_suffix(".json").write_text(json.dumps(self.rows, indent=1) + "\n")
        lines = ["| scenario | coordinator | skew | admitted per window by answer time "
                 "[definite-upper] | max placed / limit | U_capacity | refusals by reason | "
                 "slowest answer (ms) | fault |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            reasons = ", ".join(f"{k}: {v}" for k, v in sorted(r["reasons"].items()))
            wins = " ".join(f"{a}" + (f" [{d}-{u}]" if d != u else "")
                            for a, d, u in zip(r["admitted"], r["definite"], r["upper"]))
            lines.append(f"| {r['scenario']} | {r['coordinator']} | {r['skew']} | {wins} | "
                         f"{r['max_assigned']} / {r['limit']} | {r['u_capacity']:.3f} | "
                         f"{reasons} | {r['slowest_ms']:.0f} | {r.get('fault', '')} |")
        self.path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def fed_results() -> FederationResults:
    return FederationResults(
        Path(os.environ.get("SLUICE_FEDERATION_RESULTS", "federation-results.md")).resolve())


def sleep_until(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


def boundary(i: int) -> float:
    """The wall-clock start of window i."""
    return i * WINDOW


class Run:
    """Three regions on a fresh budget under load, and what the load saw."""

    def __init__(self, workdir: Path, coord: harness.Coordinator, scenario: str, skew: str,
                 retry_backoff_ms: Optional[int] = None):
        self.scenario, self.skew, self.coordinator = scenario, skew, coord.label
        self.fed = FederationConfig(limit=LIMIT, window_ms=int(WINDOW * 1000), batch=BATCH,
                                    budget=f"{scenario}-{uuid.uuid4().hex[:6]}")
        if retry_backoff_ms is not None:
            self.fed.retry_backoff_ms = retry_backoff_ms
        self.dir = workdir / self.fed.budget
        self.dir.mkdir()
        self.nodes = self.make_nodes(coord)
        self.load: Optional[CheckLoad] = None
        self.first = 0  # the first window measured

    def make_nodes(self, coord: harness.Coordinator) -> List[FederatedNode]:
        return [FederatedNode(self.dir, r, sluice_bin(), coord, self.fed) for r in REGIONS]

    def weights(self) -> List[float]:
        return SKEWS[self.skew]

    def __enter__(self) -> "Run":
        try:
            for n in self.nodes:
                n.launch()
            for n in self.nodes:
                n.wait_serving()
            self.load = CheckLoad(self.nodes, OFFERED * LIMIT / WINDOW, self.weights())
            self.load.start()
            # The window the load starts in may be the one a fresh coordinator counts as spent.
            self.first = window_of(time.time(), WINDOW) + 1
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.load is not None:
            self.load.stop()
        for n in self.nodes:
            n.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {n.name}\n{harness.tail(n.log)}" for n in self.nodes)


def check_bound(records, counts: Dict[int, harness.WindowCount], run: Run) -> None:
    """No window over the limit: each admission that straddles a boundary is put in one of the
    windows it may have fallen in, and a window over the limit even so is a proven overshoot.
    (Counting straddlers in both windows would flag every full window followed by an admission
    early in the next one: at an offered load above the limit a window holds exactly LIMIT.)"""
    errors = [r for r in records if r.reason.startswith("error")]
    assert not errors, (f"{len(errors)} checks failed (no answer within the client's "
                        f"{run.nodes[0].client.timeout} s), the first: {errors[0]}\n{run.logs()}")
    over = least_assignment(records, counts, WINDOW, GUARD, LIMIT)
    assert not over, (f"windows over the limit {LIMIT}: "
                      + ", ".join(f"{i}: at least {counts[i].assigned} (definite "
                                  f"{counts[i].definite}, upper {counts[i].upper})" for i in over)
                      + f"\n{run.logs()}")


def u_capacity(counts: Dict[int, harness.WindowCount], windows: List[int]) -> float:
    admitted = sum(counts[i].admitted for i in windows)
    usable = sum(min(counts[i].offered, LIMIT) for i in windows)
    return admitted / usable if usable else 0.0


def report(fed_results: FederationResults, run: Run, counts: Dict[int, harness.WindowCount],
           measured: List[int], u: float, fault: str = "", load: Optional[CheckLoad] = None,
           **extra) -> None:
    load = load or run.load
    slowest = max(r.received - r.sent for r in load.snapshot())
    shown = [counts[i] for i in range(run.first, max(counts) + 1) if i in counts]
    reasons: Dict[str, int] = {}
    for c in shown:
        for k, v in c.refusals.items():
            reasons[k] = reasons.get(k, 0) + v
    skew = run.skew if load is run.load else f"{run.skew}, key {load.key}"
    row = {"scenario": run.scenario, "coordinator": run.coordinator,
           "skew": f"{skew}, {load.rate * WINDOW:.0f}/window",
           "limit": LIMIT, "window_s": WINDOW,
           "batch": BATCH, "offered_x": OFFERED, "first_window": run.first,
           "upper": [c.upper for c in shown], "definite": [c.definite for c in shown],
           "assigned": [c.assigned for c in shown],
           "admitted": [c.admitted for c in shown], "offered": [c.offered for c in shown],
           "max_upper": max(c.upper for c in counts.values()),
           "max_assigned": max(c.assigned for c in counts.values()), "measured": measured,
           "u_capacity": u, "reasons": reasons, "fault": fault, "slowest_ms": slowest * 1000,
           "per_window_refusals": [c.refusals for c in shown], **extra}
    fed_results.add(row)
    print(json.dumps(row))


def test_window_accounting_places_straddlers_and_proves_overshoots():
    """The accounting alone, on made-up calls (window 2 s, limit 3, guard 0.02 s)."""

    def rec(sent, received, allowed=True):
        return harness.CheckRecord("r", "k", sent, received, allowed, "" if allowed else "x")

    # Window 10 ([20, 22)) full with 3; one admission straddles 22: it fits in window 11.
    records = [rec(20.5, 20.6), rec(21.0, 21.1), rec(21.5, 21.6), rec(21.995, 22.001),
               rec(22.5, 22.6), rec(21.2, 21.3, allowed=False)]
    counts = per_window(records, 2.0, 0.02)
    assert [(c.definite, c.upper) for c in counts.values()] == [(3, 4), (1, 2)]
    assert counts[10].refusals == {"x": 1} and counts[10].offered == 5
    assert least_assignment(records, counts, 2.0, 0.02, 3) == []
    assert [c.assigned for c in counts.values()] == [3, 2]
    # Window 11 full too: the straddler fits nowhere, an overshoot whatever its time was.
    records += [rec(23.0, 23.1), rec(23.5, 23.6)]
    counts = per_window(records, 2.0, 0.02)
    assert least_assignment(records, counts, 2.0, 0.02, 3) == [11]
    # A window with more definite admissions than the limit.
    counts = per_window(records[:3] + [rec(21.7, 21.8)], 2.0, 0.02)
    assert least_assignment(records[:3] + [rec(21.7, 21.8)], counts, 2.0, 0.02, 3) == [10]


@pytest.mark.parametrize("skew", list(SKEWS))
def test_steady_load_stays_within_the_limit_in_every_window(tmp_path, coord, fed_results, skew):
    with Run(tmp_path, coord, "steady", skew) as run:
        last = run.first + STEADY_WINDOWS - 1
        sleep_until(boundary(last + 1) + 0.1)
    records = run.load.snapshot()
    counts = per_window(records, WINDOW, GUARD)
    check_bound(records, counts, run)
    measured = list(range(run.first, last + 1))
    u = u_capacity(counts, measured)
    report(fed_results, run, counts, measured, u)
    # Offered above the limit in every measured window, so the limit is what U is measured on.
    for i in measured:
        assert counts[i].offered > LIMIT, f"window {i}: only {counts[i].offered} checks offered"
        # In a steady window a region refuses only for a spent budget.
        assert set(counts[i].refusals) <= {"budget_spent"}, (i, counts[i].refusals, run.logs())
    assert u >= U_FLOOR, f"U_capacity {u:.3f} < {U_FLOOR:.3f}"


def fault_run(tmp_path, coord, scenario: str, at: float,
              inject: Callable[[harness.Coordinator, "Run"], Dict[str, object]],
              windows_after: int, retry_backoff_ms: Optional[int] = None, run_type=Run):
    """Steady load for one window, then in window f = first + 1 the fault at `at` x WINDOW into
    it; `inject` does it and returns its times ("start", "end") and anything it saw; then
    `windows_after` full windows after the window it ends in."""
    with run_type(tmp_path, coord, scenario, "uniform", retry_backoff_ms) as run:
        f = run.first + 1
        sleep_until(boundary(f) + at * WINDOW)
        times = inject(coord, run)
        back = window_of(times["end"], WINDOW)
        sleep_until(boundary(back + 1 + windows_after) + 0.1)
    records = run.load.snapshot()
    counts = per_window(records, WINDOW, GUARD)
    check_bound(records, counts, run)
    return run, f, back, times, records, counts


def test_coordinator_sigstop_mid_window(tmp_path, coord, fed_results):
    """The coordinator stopped 0.4 windows into a window, for 1.6 windows: the regions serve the
    escrow they hold, then refuse (coordinator_unreachable); a window wholly inside the outage
    admits nothing; after SIGCONT admissions resume, at full capacity from the next window."""

    def inject(c, run):
        t0 = time.time()
        c.signal(signal.SIGSTOP)
        f = window_of(t0, WINDOW)
        sleep_until(boundary(f + 2) + 0.05 * WINDOW)
        t1 = time.time()
        c.signal(signal.SIGCONT)
        return {"start": t0, "end": t1}

    run, f, back, times, records, counts = fault_run(tmp_path, coord, "sigstop", 0.4,
                                                     inject, 2)
    t0, t1 = times["start"], times["end"]
    inside = f + 1  # wholly inside the outage
    assert back == f + 2
    # Escrow served: admissions decided surely after the stop, in the window it happened in.
    escrow = [r for r in records if r.allowed and r.sent > t0 + GUARD
              and r.received < boundary(f + 1) - GUARD]
    unreachable = sorted(r.sent for r in records if r.reason == "coordinator_unreachable")
    assert unreachable, f"no refusal said coordinator_unreachable\n{run.logs()}"
    first_unreachable = unreachable[0] - t0
    # Nothing after the escrow: the window wholly inside the outage admits nothing, and refuses
    # only because the coordinator cannot be reached.
    assert counts[inside].definite == 0, (counts[inside], run.logs())
    assert set(counts[inside].refusals) == {"coordinator_unreachable"}, counts[inside].refusals
    # Admissions resume after SIGCONT (within the retry backoff), at full capacity next window.
    resumed = sorted(r.received for r in records if r.allowed and r.sent > t1)
    assert resumed, "no admission after SIGCONT"
    measured = list(range(back + 1, back + 3))
    u = u_capacity(counts, measured)
    report(fed_results, run, counts, measured, u,
           fault=(f"SIGSTOP {t0 - boundary(f):.2f} s into window +{f - run.first}, "
                  f"SIGCONT {t1 - boundary(back):.2f} s into window +{back - run.first}; "
                  f"escrow served after the stop: {len(escrow)}; first coordinator_unreachable "
                  f"{first_unreachable:.2f} s after it; first admission "
                  f"{resumed[0] - t1:.2f} s after SIGCONT"),
           escrow_after_stop=len(escrow), first_unreachable_s=first_unreachable,
           resumed_after_s=resumed[0] - t1)
    assert u >= U_FLOOR, f"U_capacity after the outage {u:.3f} < {U_FLOOR:.3f}"


def ledger(c: harness.PostgresCoordinator, run: Run, key: str = "k") -> Tuple[int, int, int]:
    """The PostgreSQL coordinator's ledger row of `key` in the run's budget: (window start in
    ns, units granted in that window, units given back to it)."""
    rows = c.query("SELECT window_start, granted, returned FROM sluice_fed_ledger "
                   f"WHERE key = '{run.fed.budget}:{key}'")
    assert len(rows) == 1, f"no ledger row for {run.fed.budget}:{key}: {rows}"
    return int(rows[0][0]), int(rows[0][1]), int(rows[0][2])


def test_coordinator_sigkill_and_restart_mid_window(tmp_path, coord, fed_results):
    """The coordinator killed 0.25 windows into a window and restarted at once on the same port
    (and, for PostgreSQL, the same data directory); the regions serve the escrow they hold,
    then, by backend:

    - state lost (Redis without persistence): the rest of that window is refused (the
      restarted coordinator counts it as spent: coordinator_restarted; coordinator_unreachable
      while a region's call failed), and no region admits after it was told;
    - state kept (PostgreSQL, commits durable): the restarted coordinator's ledger still holds
      the window's grants, at least every admission answered before the kill; nothing is
      refused as coordinator_restarted, in that window or any other; refusals are only
      coordinator_unreachable (a region's call failed on the dropped connection: its retry
      backoff) and budget_spent, and the window stays within the limit with what the regions
      lease after the restart.

    Either way the next windows admit at full capacity."""

    def inject(c, run):
        t0 = time.time()
        c.kill()
        c.start()
        out = {"start": t0, "end": time.time()}
        if c.keeps_state():
            # At once, before any lease of the next window can roll the ledger over.
            out["ledger"] = ledger(c, run)
            out["read_at"] = time.time()
        return out

    run, f, back, times, records, counts = fault_run(tmp_path, coord, "sigkill", 0.25,
                                                     inject, 2)
    t0, t1 = times["start"], times["end"]
    assert back == f, f"the restart took {t1 - t0:.2f} s, past the window"
    after = [r for r in records if r.sent > t1 and r.received < boundary(f + 1) - GUARD]
    reasons: Dict[str, int] = {}
    for r in after:
        reasons[r.reason or "admitted"] = reasons.get(r.reason or "admitted", 0) + 1
    extra: Dict[str, object] = {}
    if coord.keeps_state():
        # From the first measured window on (a coordinator met for the first time counts the
        # window it creates its state in as spent).
        restarted = [r for r in records if r.reason == "coordinator_restarted"
                     and r.sent >= boundary(run.first)]
        assert not restarted, (f"{len(restarted)} refused as coordinator_restarted though the "
                               f"coordinator kept its state, the first: {restarted[0]}\n"
                               f"{run.logs()}")
        assert set(reasons) <= {"admitted", "coordinator_unreachable", "budget_spent"}, reasons
        # Every admission answered before the kill, decided surely in the window, came from a
        # grant the coordinator acknowledged before it: the restarted coordinator must count
        # it (a grant given back is one a region did not spend, so granted - returned is at
        # least what the regions spent).
        window_start, granted, returned = times["ledger"]
        before = sum(1 for r in records if r.allowed and r.received < t0
                     and r.sent - GUARD >= boundary(f))
        assert window_start == f * WINDOW_NS, (
            f"the ledger is on window {window_start // WINDOW_NS}, not {f} (read "
            f"{times['read_at'] - boundary(f):.2f} s into it)")
        assert granted - returned >= before, (
            f"the restarted coordinator forgot grants: granted {granted} - returned {returned} "
            f"< {before} admitted before the kill\n{run.logs()}")
        state = (f"state kept: ledger granted {granted}, returned {returned}, read "
                 f"{times['read_at'] - t1:.2f} s after; admitted before the kill: {before}")
        extra = {"ledger_granted": granted, "ledger_returned": returned,
                 "admitted_before_kill": before}
    else:
        assert "coordinator_restarted" in reasons, (reasons, run.logs())
        # Once a region was told, it refuses for the rest of the window: no admission decided
        # after its first coordinator_restarted (escrow held is spent before any lease is
        # asked for).
        for region in REGIONS:
            told = [r.received for r in after if r.region == region
                    and r.reason == "coordinator_restarted"]
            if told:
                late = [r for r in after if r.region == region and r.allowed
                        and r.sent > told[0]]
                assert not late, f"{region} admitted {len(late)} after coordinator_restarted"
        assert set(reasons) <= {"admitted", "coordinator_restarted",
                                "coordinator_unreachable"}, reasons
        state = "empty"
    resumed = sorted(r.received for r in records if r.allowed and r.sent > t1)
    assert resumed, "no admission after the restart"
    measured = list(range(f + 1, f + 3))
    u = u_capacity(counts, measured)
    report(fed_results, run, counts, measured, u,
           fault=(f"SIGKILL {t0 - boundary(f):.2f} s into window +{f - run.first}, back "
                  f"{t1 - t0:.2f} s later ({state}); after it in that window: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
                  + f"; first admission {resumed[0] - t1:.2f} s after the restart"),
           after_restart=reasons, escrow_after_restart=reasons.get("admitted", 0),
           resumed_after_s=resumed[0] - t1, **extra)
    assert u >= U_FLOOR, f"U_capacity after the restart {u:.3f} < {U_FLOOR:.3f}"


def test_short_coordinator_pauses_across_window_boundaries(tmp_path, coord, fed_results):
    """The coordinator stopped for 200 ms (less than the lease timeout) across each of three
    window boundaries, under two keys: `k` at OFFERED x the limit, `warm` at 0.9 x it (its escrow
    is live at the boundary, its budget not spent). The leases asked just before a boundary are
    answered just after it, in the new window: no window over the limit, on either key."""
    with Run(tmp_path, coord, "pauses", "uniform") as run:
        warm = CheckLoad(run.nodes, 0.9 * LIMIT / WINDOW, SKEWS["uniform"], key="warm")
        warm.start()
        try:
            first_pause = run.first + 1
            for i in range(first_pause, first_pause + 3):
                sleep_until(boundary(i) - 0.12)
                coord.signal(signal.SIGSTOP)
                sleep_until(boundary(i) + 0.08)
                coord.signal(signal.SIGCONT)
            sleep_until(boundary(first_pause + 3) + 0.1)
        finally:
            warm.stop()
    for load in (run.load, warm):
        records = load.snapshot()
        counts = per_window(records, WINDOW, GUARD)
        check_bound(records, counts, run)
        measured = list(range(run.first, first_pause + 3))
        reasons = {k for i in measured for k in counts[i].refusals}
        assert reasons <= {"budget_spent", "coordinator_unreachable"}, reasons
        report(fed_results, run, counts, measured, u_capacity(counts, measured),
               fault="SIGSTOP 0.12 s before each of 3 boundaries, SIGCONT 0.08 s after",
               load=load)


# ---- partial losses: a coordinator back with fewer grants than it acknowledged ----

# The regions' retry_backoff in these scenarios: short, so that they lease again within the
# window of the loss, where a coordinator that did not know what it lost would hand the lost
# grants out a second time.
LOSS_BACKOFF_MS = 250
# x WINDOW into the window of the fault: the state the coordinator will come back with fixed
# (a snapshot, the AOF's size, the replication link cut; the eviction), then the SIGKILL (of the
# primary, for a failover).
SNAPSHOT_AT = 0.2
KILL_AT = 0.5
LOSS_WINDOWS_AFTER = 1
# After the loss, in its window: admissions from escrow the regions held, coordinator_unreachable
# while a region's call failed (its retry backoff), budget_spent for a region told so before.
LOSS_REASONS = {"admitted", "coordinator_restarted", "coordinator_unreachable", "budget_spent"}


@pytest.fixture
def scratch():
    """Servers and forwarders of the scenario's own: `scratch(x)` returns x, stopped at the
    scenario's end (the last made first)."""
    made = []

    def keep(x):
        made.append(x)
        return x

    yield keep
    for x in reversed(made):
        x.stop()


Ledger = Optional[Tuple[int, int]]  # (window, units granted in it); None: no ledger


def redis_ledger(port: int, run: Run, key: str = "k") -> Ledger:
    """The Redis coordinator's ledger of `key` in the run's budget, on the Redis at `port`
    (decoded by the coordinator script's own MessagePack library: [version, w, h, lim, p, g,
    ...])."""
    cli = harness.RedisClient(port)
    try:
        v = cli.command("EVAL", "local v = redis.call('GET', KEYS[1]) "
                        "return v and cmsgpack.unpack(v)", "1",
                        f"sluice:fed:{{{run.fed.budget}:{key}}}")
    finally:
        cli.close()
    return None if not v else (int(v[1]) // int(WINDOW * 1e6), int(v[5]))


def pg_ledger(c: harness.PostgresCoordinator, run: Run) -> Ledger:
    window_start, granted, _ = ledger(c, run)
    return window_start // WINDOW_NS, granted


def shown(lg: Ledger, run: Run) -> str:
    return "none" if lg is None else f"{lg[1]} granted in window +{lg[0] - run.first}"


def behind(after: Ledger, before: Ledger) -> bool:
    """Whether a ledger read after the fault is behind the one read before: an earlier window,
    or fewer units granted in the same one (a grant is never taken back within a window)."""
    return before is not None and (after is None or after < before)


def loss_window(run: Run, records, counts: Dict[int, harness.WindowCount], f: int, back: int,
                t1: float) -> Tuple[Dict[str, int], List[int], float]:
    """What every loss requires beyond the bound: the coordinator back within the window of the
    loss (f); the rest of that window refused coordinator_restarted once the regions reach it
    (else only what LOSS_REASONS allows); the window before the fault and the windows after its
    own refusing nothing but budget_spent (one window is spent, no other); an admission after
    the coordinator was back. Returns what was decided after that in window f, the windows
    after it and their U_capacity."""
    assert back == f, (f"the coordinator was back {t1 - boundary(f):.2f} s into window "
                       f"+{f - run.first}, past it\n{run.logs()}")
    reasons: Dict[str, int] = {}
    for r in records:
        if r.sent > t1 and r.received < boundary(f + 1) - GUARD:
            reasons[r.reason or "admitted"] = reasons.get(r.reason or "admitted", 0) + 1
    assert "coordinator_restarted" in reasons, (
        f"no coordinator_restarted in the window of the loss once the coordinator was back: "
        f"{reasons}\n{run.logs()}")
    assert set(reasons) <= LOSS_REASONS, (reasons, run.logs())
    measured = list(range(f + 1, f + 1 + LOSS_WINDOWS_AFTER))
    for i in [run.first] + measured:
        assert set(counts[i].refusals) <= {"budget_spent"}, (i, counts[i].refusals, run.logs())
        assert counts[i].offered > LIMIT, f"window {i}: only {counts[i].offered} checks offered"
    assert any(r.allowed and r.sent > t1 for r in records), "no admission after the fault"
    return reasons, measured, u_capacity(counts, measured)


def after_text(reasons: Dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))


def restart_with(c: harness.RedisCoordinator, run: Run, t0: float,
                 meddle: Callable[[], None]) -> Dict[str, object]:
    """SIGKILL KILL_AT x WINDOW into the window of `t0`, `meddle` with what it left on disk,
    restart on the same port and directory; the ledger read just before the kill and at once
    after the restart (the regions, their connections broken, lease again after their retry
    backoff; a lease that finds the state lost grants nothing anyway)."""
    sleep_until(boundary(window_of(t0, WINDOW)) + KILL_AT * WINDOW)
    before = redis_ledger(c.port, run)
    killed = time.time()
    c.kill()
    meddle()
    c.start()
    end = time.time()
    return {"start": t0, "killed": killed, "end": end, "before": before,
            "after": redis_ledger(c.port, run)}


def report_loss(fed_results, run: Run, counts, f: int, measured: List[int], u: float,
                reasons: Dict[str, int], times: Dict[str, object], what: str,
                **extra) -> None:
    t1 = times["end"]
    report(fed_results, run, counts, measured, u,
           fault=(f"{what}; ledger before {shown(times['before'], run)}, after "
                  f"{shown(times['after'], run)}; after it in that window: "
                  f"{after_text(reasons)}"),
           after_fault=reasons, ledger_before=times["before"], ledger_after=times["after"],
           back_s=t1 - boundary(f), **extra)


def test_redis_restart_from_an_rdb_snapshot_taken_mid_window(tmp_path, scratch, fed_results):
    """Redis with RDB persistence (snapshots only when asked): SAVE 0.2 windows into a window,
    SIGKILL 0.5 windows in and a restart on the same port and directory, loading the snapshot.
    The grants made between the two are gone (the ledger read at once after the restart is
    behind the one read just before the kill), and nothing in the data says so; the restarted
    server is another process (run_id). The rest of that window is refused
    coordinator_restarted once the regions reach it, no window goes over the limit, and the
    next window admits at full capacity."""
    redis = scratch(harness.RedisCoordinator(tmp_path / "rdb", persistence="rdb"))
    redis.start()

    def inject(c, run):
        t0 = time.time()
        harness.redis_cli(c, "SAVE")
        saved = time.time()
        out = restart_with(c, run, t0, lambda: None)
        out["saved"] = saved
        return out

    run, f, back, times, records, counts = fault_run(tmp_path, redis, "rdb-restart", SNAPSHOT_AT,
                                                     inject, LOSS_WINDOWS_AFTER,
                                                     LOSS_BACKOFF_MS)
    reasons, measured, u = loss_window(run, records, counts, f, back, times["end"])
    assert behind(times["after"], times["before"]), (times, run.logs())
    report_loss(fed_results, run, counts, f, measured, u, reasons, times,
                f"SAVE {times['start'] - boundary(f):.2f} s into window +{f - run.first} "
                f"({times['saved'] - times['start']:.3f} s), SIGKILL "
                f"{times['killed'] - boundary(f):.2f} s into it, back with the snapshot "
                f"{times['end'] - times['killed']:.2f} s later")
    assert u >= U_FLOOR, f"U_capacity after the restart {u:.3f} < {U_FLOOR:.3f}"


def test_redis_restart_from_a_truncated_aof(tmp_path, scratch, fed_results):
    """Redis with an append-only file: its incremental file's size read 0.2 windows into a
    window; SIGKILL 0.5 windows in, the file cut back to that size (the writes after it lost, as
    a machine crash loses what appendfsync everysec had not synced), restart loading it. As with
    the snapshot: the restarted Redis is behind what it granted, the rest of the window is
    refused coordinator_restarted, no window over the limit, the next at full capacity."""
    redis = scratch(harness.RedisCoordinator(tmp_path / "aof", persistence="aof"))
    redis.start()

    def inject(c, run):
        t0 = time.time()
        aof = c.incr_aof()
        size = aof.stat().st_size
        cut: List[int] = []

        def truncate():
            cut.append(aof.stat().st_size - size)
            os.truncate(aof, size)

        out = restart_with(c, run, t0, truncate)
        out["cut"] = cut[0]
        return out

    run, f, back, times, records, counts = fault_run(tmp_path, redis, "aof-truncated",
                                                     SNAPSHOT_AT, inject, LOSS_WINDOWS_AFTER,
                                                     LOSS_BACKOFF_MS)
    reasons, measured, u = loss_window(run, records, counts, f, back, times["end"])
    assert times["cut"] > 0, "nothing written to the AOF between the size read and the kill"
    assert behind(times["after"], times["before"]), (times, run.logs())
    report_loss(fed_results, run, counts, f, measured, u, reasons, times,
                f"AOF size read {times['start'] - boundary(f):.2f} s into window "
                f"+{f - run.first}, SIGKILL {times['killed'] - boundary(f):.2f} s into it, the "
                f"{times['cut']} bytes written since cut off, back "
                f"{times['end'] - times['killed']:.2f} s later", aof_cut_bytes=times["cut"])
    assert u >= U_FLOOR, f"U_capacity after the restart {u:.3f} < {U_FLOOR:.3f}"


EVICTION_HEADROOM = 64 * 1024  # bytes of maxmemory above used_memory
FILLER = 10 * 1024  # bytes per filler key


def test_redis_eviction_policy_changed_under_pressure(tmp_path, scratch, fed_results):
    """A Redis whose eviction policy is changed while it serves (CONFIG SET maxmemory-policy
    volatile-ttl: the coordinator checks it only when it connects), 0.2 windows into a window,
    with maxmemory set just above its use, then filler keys written (10 KB each, a day's TTL)
    until the ledger of the hot key (a minute's TTL: the nearest expiry) is evicted; then
    maxmemory 0 and noeviction again. Nothing restarts and no connection breaks: the first lease
    after an eviction finds evicted_keys moved and counts the window as spent. The rest of that
    window is refused coordinator_restarted, no window over the limit, the next at full
    capacity."""
    redis = scratch(harness.RedisCoordinator(tmp_path / "evict"))
    redis.start()

    def inject(c, run):
        cli = harness.RedisClient(c.port)
        ledger_key = f"sluice:fed:{{{run.fed.budget}:k}}"
        cli.command("CONFIG", "SET", "notify-keyspace-events", "Ee")
        events = scratch(harness.RedisKeyEvents(c.port, "evicted"))
        before = redis_ledger(c.port, run)
        t0 = time.time()
        cli.command("CONFIG", "SET", "maxmemory-policy", "volatile-ttl")
        used = int(cli.info("memory")["used_memory"])
        cli.command("CONFIG", "SET", "maxmemory", used + EVICTION_HEADROOM)
        fillers = 0
        while ledger_key not in events.keys and fillers < 1000:
            cli.command("SET", f"filler{fillers}", "x" * FILLER, "EX", 86400)
            fillers += 1
        cli.command("CONFIG", "SET", "maxmemory", 0)
        cli.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
        t1 = time.time()
        evicted = int(cli.info("stats")["evicted_keys"])
        cli.close()
        return {"start": t0, "end": t1, "before": before, "after": redis_ledger(c.port, run),
                "fillers": fillers, "evicted": evicted, "evicted_keys": list(events.keys),
                "ledger_key": ledger_key}

    run, f, back, times, records, counts = fault_run(tmp_path, redis, "eviction", SNAPSHOT_AT,
                                                     inject, LOSS_WINDOWS_AFTER,
                                                     LOSS_BACKOFF_MS)
    keys = times["evicted_keys"]
    assert times["ledger_key"] in keys, (
        f"the ledger was not evicted ({times['fillers']} fillers written; evicted: {keys})")
    reasons, measured, u = loss_window(run, records, counts, f, back, times["end"])
    position = keys.index(times["ledger_key"]) + 1
    report_loss(fed_results, run, counts, f, measured, u, reasons, times,
                f"volatile-ttl and maxmemory +{EVICTION_HEADROOM // 1024} KB "
                f"{times['start'] - boundary(f):.2f} s into window +{f - run.first}, "
                f"{times['fillers']} fillers written, {times['evicted']} keys evicted (the "
                f"ledger as number {position}), noeviction again "
                f"{times['end'] - times['start']:.3f} s later",
                fillers=times["fillers"], evicted=times["evicted"], ledger_evicted_at=position)
    assert u >= U_FLOOR, f"U_capacity after the eviction {u:.3f} < {U_FLOOR:.3f}"


def test_redis_failover_to_a_replica_that_missed_the_last_writes(tmp_path, scratch,
                                                                 fed_results):
    """A Redis primary and a replica (REPLICAOF, through a forwarder on the replication link),
    the regions configured with one address, a forwarder in front of the primary (an address
    that moves, as a virtual IP). 0.2 windows into a window the replication link stops carrying
    data (the replica misses every later grant; a SIGSTOP of the replica would not do: the
    stream waits in the socket buffers and the replica applies it when continued); 0.5 windows
    in, SIGKILL of the primary, REPLICAOF NO ONE on the replica, and the address moves to it
    (every connection through it closed). The replica's ledger is behind the primary's; it is
    another server process (run_id). The rest of the window is refused coordinator_restarted,
    no window over the limit, the next at full capacity."""
    primary = scratch(harness.RedisCoordinator(tmp_path / "primary"))
    primary.start()
    harness.redis_cli(primary, "CONFIG", "SET", "repl-diskless-sync-delay", "0")
    link = scratch(harness.TcpForwarder(primary.port))
    replica = scratch(harness.RedisCoordinator(tmp_path / "replica", replica_of=link.port))
    replica.start()
    harness.wait_until(lambda: "master_link_status:up" in harness.redis_cli(
        replica, "INFO", "replication"), 10, what="the replica in sync")
    vip = scratch(harness.TcpForwarder(primary.port))
    coord = harness.Fronted(primary, vip, "redis + replica")

    def inject(c, run):
        t0 = time.time()
        link.hold()
        sleep_until(boundary(window_of(t0, WINDOW)) + KILL_AT * WINDOW)
        before = redis_ledger(primary.port, run)
        killed = time.time()
        primary.kill()
        link.move(None)
        after = redis_ledger(replica.port, run)
        harness.redis_cli(replica, "REPLICAOF", "NO", "ONE")
        vip.move(replica.port)
        return {"start": t0, "killed": killed, "end": time.time(), "before": before,
                "after": after}

    run, f, back, times, records, counts = fault_run(tmp_path, coord, "failover", SNAPSHOT_AT,
                                                     inject, LOSS_WINDOWS_AFTER,
                                                     LOSS_BACKOFF_MS)
    reasons, measured, u = loss_window(run, records, counts, f, back, times["end"])
    assert behind(times["after"], times["before"]), (times, run.logs())
    report_loss(fed_results, run, counts, f, measured, u, reasons, times,
                f"replication link cut {times['start'] - boundary(f):.2f} s into window "
                f"+{f - run.first}, primary SIGKILL {times['killed'] - boundary(f):.2f} s into "
                f"it, replica promoted and the address moved to it "
                f"{times['end'] - times['killed']:.2f} s later")
    assert u >= U_FLOOR, f"U_capacity after the failover {u:.3f} < {U_FLOOR:.3f}"


@pytest.mark.parametrize("coord", ["postgres"], indirect=True)
def test_postgres_failover_to_an_async_standby(tmp_path, coord, scratch, fed_results):
    """The suite's PostgreSQL and an asynchronous standby of it (pg_basebackup -R, streaming
    through a forwarder on the replication link), the regions configured with both in one libpq
    conninfo (target_session_attrs=read-write). 0.2 windows into a window the link stops
    carrying WAL (the standby misses every later grant; as for Redis, a SIGSTOP of the standby
    would not do); 0.5 windows in, SIGKILL of the primary and pg_promote() on the standby: a
    new WAL timeline. The standby's ledger is behind the primary's; the first lease on the new
    timeline counts the window as spent: the rest of it is refused coordinator_restarted, no
    window over the limit, the next at full capacity. The suite's PostgreSQL is started again
    afterwards (the standby is dropped)."""
    link = scratch(harness.TcpForwarder(coord.port))
    standby = scratch(harness.PostgresCoordinator(tmp_path, synchronous_commit="off",
                                                  durable_commits=True, standby_of=coord,
                                                  upstream_port=link.port))
    standby.start()
    harness.wait_until(standby.streaming, 10, interval=0.1, what="the standby streaming")
    failover = harness.PostgresFailover(coord, standby, "postgres + async standby")

    def inject(c, run):
        t0 = time.time()
        link.hold()
        sleep_until(boundary(window_of(t0, WINDOW)) + KILL_AT * WINDOW)
        before = pg_ledger(coord, run)
        killed = time.time()
        coord.kill()
        link.move(None)
        after = pg_ledger(standby, run)
        standby.promote()
        return {"start": t0, "killed": killed, "end": time.time(), "before": before,
                "after": after}

    try:
        run, f, back, times, records, counts = fault_run(tmp_path, failover, "failover",
                                                         SNAPSHOT_AT, inject, LOSS_WINDOWS_AFTER,
                                                         LOSS_BACKOFF_MS)
        timeline = standby.query("SELECT timeline FROM sluice_fed_origin")
    finally:
        if coord.proc.poll() is not None:
            coord.start()
    reasons, measured, u = loss_window(run, records, counts, f, back, times["end"])
    assert behind(times["after"], times["before"]), (times, run.logs())
    assert timeline == [["00000002"]], f"origin row on timeline {timeline}, not 2"
    report_loss(fed_results, run, counts, f, measured, u, reasons, times,
                f"replication link cut {times['start'] - boundary(f):.2f} s into window "
                f"+{f - run.first}, primary SIGKILL {times['killed'] - boundary(f):.2f} s into "
                f"it, standby promoted {times['end'] - times['killed']:.2f} s later (timeline 2)")
    assert u >= U_FLOOR, f"U_capacity after the failover {u:.3f} < {U_FLOOR:.3f}"


# ---- a regional pool: one region of several processes sharing a pool on a Redis of its own ----

POOL_REGION = "eu-west"
POOL_PROCESSES = 3
# 8 batches, the largest lease a process asks for itself. The coordinator grants at most
# ceil(remaining / (2 x regions)) (escrow.h, rule 4): 150 to a window's first lease, 50 once
# the three regions have leased in it; a refiller keeps what it needs and pools the rest.
REGIONAL_BATCH = 128
HEALTH_CHECK = 1.0  # seconds: coordinator_health_check
# Steady with a pool, a window may also lose what the pool holds unspent at its end.
U_FLOOR_POOL = 1 - ((len(REGIONS) - 1) * BATCH + REGIONAL_BATCH) / LIMIT


@pytest.fixture(scope="module")
def pool_redis(tmp_path_factory) -> Tuple[harness.RedisCoordinator, harness.RedisCoordinator]:
    """(the global coordinator, the pooled region's Redis): two Redis of this module's own."""
    d = tmp_path_factory.mktemp("federation-pool")
    started: List[harness.RedisCoordinator] = []
    try:
        for name in ("global", "regional"):
            c = harness.RedisCoordinator(d / name)
            started.append(c)
            c.start()
        yield started[0], started[1]
    finally:
        for c in started:
            c.stop()


class PoolRun(Run):
    """Run's regions, POOL_REGION as POOL_PROCESSES processes sharing a regional pool (the
    others one process each, no pool), the load spread over the processes (each pooled one
    weighted `pool_weight`, the others 1); the global
    Redis's lease calls recorded (MONITOR) from before the servers start."""

    def __init__(self, workdir: Path, redis: Tuple[harness.RedisCoordinator, ...],
                 scenario: str, outage: str = "fail-closed", pool_weight: float = 1.0):
        self.global_redis, self.regional_redis = redis
        self.pool = harness.PoolConfig(self.regional_redis, REGIONAL_BATCH, outage,
                                       int(HEALTH_CHECK * 1000))
        self.pool_weight = pool_weight
        super().__init__(workdir, self.global_redis, scenario, "uniform")
        if pool_weight != 1.0:
            self.skew = f"{POOL_REGION}'s processes x{pool_weight} each"
        self.coordinator = f"redis + pool on redis ({outage})"
        self.monitor: Optional[harness.RedisMonitor] = None

    def make_nodes(self, coord: harness.Coordinator) -> List[FederatedNode]:
        nodes = []
        for r in REGIONS:
            if r != POOL_REGION:
                nodes.append(FederatedNode(self.dir, r, sluice_bin(), coord, self.fed))
                continue
            nodes += [FederatedNode(self.dir, r, sluice_bin(), coord, self.fed,
                                    name=f"{r}-{i}", pool=self.pool)
                      for i in range(1, POOL_PROCESSES + 1)]
        return nodes

    def weights(self) -> List[float]:
        return [self.pool_weight if n.pool is not None else 1.0 for n in self.nodes]

    def __enter__(self) -> "PoolRun":
        self.monitor = harness.RedisMonitor(self.global_redis, self.dir / "global-monitor.log")
        try:
            super().__enter__()
        except BaseException:
            self.monitor.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.monitor.stop()

    def pooled(self) -> List[FederatedNode]:
        return [n for n in self.nodes if n.pool is not None]

    def pool_key(self, key: str = "k") -> str:
        return f"sluice:pool:{{{self.fed.budget}:{key}}}"

    def pool_balance(self) -> int:
        """The pool's balance now (HGET on the regional Redis; 0 for no pool yet)."""
        return int(harness.redis_cli(self.regional_redis, "HGET", self.pool_key(), "b") or 0)

    def pooled_states(self) -> List[dict]:
        states = [n.fed_state() for n in self.pooled()]
        assert all(s is not None for s in states), f"a pooled process did not answer\n{self.logs()}"
        return states


def held_escrow(states: List[dict]) -> int:
    """Units the processes hold as escrow: granted - spent - forfeited."""
    return sum(s["granted"] - s["spent"] - s["forfeited"] for s in states)


def region_admitted(records, region: str, start: float, end: float) -> int:
    """Admissions of `region` answered in [start, end)."""
    return sum(1 for r in records if r.allowed and r.region == region and start <= r.received < end)


def leases_per_window(leases: List[harness.RedisLease], windows: List[int]) -> Dict[str, list]:
    """Per region, the sizes asked by its lease calls in each of `windows`."""
    out: Dict[str, list] = {}
    for lease in leases:
        i = window_of(lease.t, WINDOW)
        if i in windows:
            out.setdefault(lease.region, [[] for _ in windows])[windows.index(i)].append(
                lease.want)
    return out


def test_pool_steady_load_leases_one_regional_batch_at_a_time(tmp_path, pool_redis,
                                                              fed_results):
    """Steady load over five processes, three of them one region sharing a pool: no window
    over the limit, every pooled process served from the pool, none of its calls failing,
    and most of what the pooled region asks the coordinator for asked in regional batches (a
    process the pool leaves short while another refills leases for itself)."""
    with PoolRun(tmp_path, pool_redis, "pool-steady") as run:
        last = run.first + STEADY_WINDOWS - 1
        sleep_until(boundary(last + 1) + 0.1)
        states = run.pooled_states()
        keys = harness.redis_cli(run.regional_redis, "--scan", "--pattern", "sluice:pool:*")
    records = run.load.snapshot()
    counts = per_window(records, WINDOW, GUARD)
    check_bound(records, counts, run)
    measured = list(range(run.first, last + 1))
    u = u_capacity(counts, measured)
    leases = leases_per_window(run.monitor.leases(), measured)
    pooled = leases.get(POOL_REGION, [[] for _ in measured])
    admitted = [region_admitted(records, POOL_REGION, boundary(i), boundary(i + 1))
                for i in measured]
    report(fed_results, run, counts, measured, u,
           fault=(f"{POOL_REGION}: {POOL_PROCESSES} processes on a pool; its coordinator "
                  f"leases per window (sizes asked): {pooled}; admitted there per window: "
                  f"{admitted}; pool_taken per process: {[s['pool_taken'] for s in states]}, "
                  f"pool_refilled: {[s['pool_refilled'] for s in states]}"),
           pool_leases=pooled, pool_region_admitted=admitted,
           pool_taken=[s["pool_taken"] for s in states],
           pool_refilled=[s["pool_refilled"] for s in states],
           other_leases={r: v for r, v in leases.items() if r != POOL_REGION})
    assert keys.split() == [run.pool_key()], keys
    for i in measured:
        assert counts[i].offered > LIMIT, f"window {i}: only {counts[i].offered} checks offered"
        assert set(counts[i].refusals) <= {"budget_spent"}, (i, counts[i].refusals, run.logs())
    # Every pooled process took from the pool, and what went into it came from their leases.
    assert all(s["pool_taken"] > 0 for s in states), states
    assert all(s["pool_failures"] == 0 and not s["in_outage"] for s in states), states
    assert sum(s["pool_taken"] for s in states) <= sum(s["pool_refilled"] for s in states)
    for i, sizes in enumerate(pooled):
        # The pool's refiller asks for a regional batch; a process left short while another
        # refills asks for itself, so most of what the region leases comes in regional batches.
        big = [w for w in sizes if w >= REGIONAL_BATCH]
        assert sum(big) * 2 > sum(sizes), (measured[i], sizes)
        # A lease of a regional batch or more is a refiller's, and asks exactly one: what it
        # needs itself (at most 8 batches) or the regional batch, whichever is more.
        assert all(w == REGIONAL_BATCH for w in big), (measured[i], sizes)
    assert u >= U_FLOOR_POOL, f"U_capacity {u:.3f} < {U_FLOOR_POOL:.3f}"


def test_pool_redis_sigkill_mid_window_falls_through_to_the_coordinator(tmp_path, pool_redis,
                                                                       fed_results):
    """The pool's Redis killed 0.3 windows into a window and started again (empty) at the start
    of the second window after: meanwhile the pooled processes lease straight from the
    coordinator (no refusal but budget_spent, no window over the limit, the region still
    served), and they take from the pool again once it is back."""
    with PoolRun(tmp_path, pool_redis, "pool-redis-sigkill") as run:
        f = run.first + 1
        sleep_until(boundary(f) + 0.3 * WINDOW)
        t0 = time.time()
        run.regional_redis.kill()
        sleep_until(boundary(f + 2))
        down = run.pooled_states()
        t1 = time.time()
        run.regional_redis.start()
        sleep_until(boundary(f + 4) + 0.1)
        after = run.pooled_states()
    records = run.load.snapshot()
    counts = per_window(records, WINDOW, GUARD)
    check_bound(records, counts, run)
    measured = list(range(f + 1, f + 4))
    u = u_capacity(counts, measured)
    leases = leases_per_window(run.monitor.leases(), [f + 1])
    admitted = [region_admitted(records, POOL_REGION, boundary(i), boundary(i + 1))
                for i in range(f, f + 4)]
    retaken = sum(a["pool_taken"] - d["pool_taken"] for a, d in zip(after, down))
    report(fed_results, run, counts, measured, u,
           fault=(f"pool Redis SIGKILL {t0 - boundary(f):.2f} s into window +{f - run.first}, "
                  f"restarted empty {t1 - t0:.2f} s later; {POOL_REGION} admitted per window "
                  f"from the kill's: {admitted}; its coordinator leases in the window without a "
                  f"pool: {leases.get(POOL_REGION)}; pool_failures per process "
                  f"{[d['pool_failures'] for d in down]}; taken from the pool after the "
                  f"restart: {retaken}"),
           pool_failures=[d["pool_failures"] for d in down], pool_region_admitted=admitted,
           retaken=retaken)
    for i in range(f, f + 4):
        assert set(counts[i].refusals) <= {"budget_spent"}, (i, counts[i].refusals, run.logs())
    # Every pooled process found the pool gone, and its region went on leasing.
    assert all(d["pool_failures"] > 0 for d in down), down
    assert leases.get(POOL_REGION), f"no lease of {POOL_REGION} without its pool"
    assert admitted[1] > 0, f"{POOL_REGION} admitted nothing without its pool"
    assert retaken > 0, f"nothing taken from the pool after its restart: {down} -> {after}"
    assert u >= U_FLOOR_POOL, f"U_capacity {u:.3f} < {U_FLOOR_POOL:.3f}"


@pytest.mark.parametrize("outage", ["regional-only", "fail-closed"])
def test_pool_coordinator_sigstop_across_a_boundary(tmp_path, pool_redis, fed_results, outage):
    """The global coordinator stopped in the last 0.35 s of a window, as soon as the pool holds a
    batch (0.1 s before the window's end at the latest), and resumed 0.6 s into the next.
    POOL_REGION, each of its processes offered a twentieth of another region's load, spends a
    refill slowly, so its pool may still hold units at the window's end; it runs `outage`.

    - regional-only: its processes enter the outage (in_outage) when their first lease of the
      new window fails, and serve the pool's balance past its window (admissions in the new
      window while the coordinator is stopped), refusing only regional_balance_spent once it
      is spent; what they admit from the stop until SIGCONT is at most what the pool and their
      escrow held at the stop, and no window admits more than the limit + that; after SIGCONT
      in_outage is false again within coordinator_health_check (+ a probe's lease timeout) and
      the region leases again.
    - fail-closed: no window over the limit; nothing admitted in the new window while the
      coordinator is stopped, refusals there only coordinator_unreachable; no outage entered."""
    regional = outage == "regional-only"
    with PoolRun(tmp_path, pool_redis, "pool-sigstop", outage, pool_weight=0.05) as run:
        f = run.first + 1
        # The stop: late in window f, as soon as the pool holds a batch (the processes take
        # what it holds into their escrow a batch at a time: the later, the more likely some
        # is left at the end), 0.1 s before its end at the latest.
        sleep_until(boundary(f + 1) - 0.35)
        while time.time() < boundary(f + 1) - 0.1 and run.pool_balance() < BATCH:
            time.sleep(0.005)
        t0 = time.time()
        run.global_redis.signal(signal.SIGSTOP)
        balance = run.pool_balance()
        escrow = held_escrow(run.pooled_states())
        onset_read = time.time()
        # What is left at the window's end (a refill whose lease was answered before the stop
        # lands in the pool within the lease timeout: what the pool gained since is counted).
        sleep_until(boundary(f + 1) - 0.03)
        at_end = run.pool_balance()
        in_transit = max(0, at_end - balance)
        # What the outage can still serve: once the window is over, the pool hands out units only
        # to a process in the outage (a process may still take some in the window's last
        # instants, into escrow that expires with it).
        sleep_until(boundary(f + 1) + GUARD)
        past_end = run.pool_balance()
        sleep_until(boundary(f + 1) + 0.3 * WINDOW)
        during = run.pooled_states()
        t1 = time.time()
        run.global_redis.signal(signal.SIGCONT)
        # When the first and the last pooled process are out of the outage again.
        outs: List[float] = []

        def all_out() -> Optional[float]:
            states = run.pooled_states()
            if not outs and any(not s["in_outage"] for s in states):
                outs.append(time.time())
            return all(not s["in_outage"] for s in states) and time.time()

        cleared = harness.wait_until(all_out, HEALTH_CHECK + 2, interval=0.02,
                                     what="in_outage back to false")
        first_out = outs[0]
        sleep_until(boundary(f + 3) + 0.1)
        end = run.pooled_states()
    records = run.load.snapshot()
    counts = per_window(records, WINDOW, GUARD)
    errors = [r for r in records if r.reason.startswith("error")]
    assert not errors, f"{len(errors)} checks failed, the first: {errors[0]}\n{run.logs()}"
    allowance = balance + escrow + in_transit if regional else 0
    over = least_assignment(records, counts, WINDOW, GUARD, LIMIT)
    placed = {i: counts[i].assigned for i in range(f, f + 3)}
    excess = max(0, max(placed.values()) - LIMIT)
    # The pooled region's admissions asked after the onset was read, answered before SIGCONT.
    served = [r for r in records if r.allowed and r.region == POOL_REGION
              and r.sent >= onset_read and r.received < t1]
    # Its admissions decided surely in the new window while every pooled process was still in
    # the outage (leasing nothing, with SIGCONT or not), or, fail-closed, before SIGCONT: the
    # pool's balance past its window.
    carried = sum(1 for r in records if r.allowed and r.region == POOL_REGION
                  and r.sent - GUARD >= boundary(f + 1)
                  and r.received < (first_out if regional else t1))
    # Refusals in the new window once the first lease of it has failed, before SIGCONT.
    failed_by = boundary(f + 1) + run.fed.lease_timeout_ms / 1000 + 0.05
    refused = {}
    for r in records:
        if not r.allowed and r.region == POOL_REGION and failed_by <= r.sent and r.received < t1:
            refused[r.reason] = refused.get(r.reason, 0) + 1
    # Leases sent during the stop reach Redis at SIGCONT (their callers gone): count those
    # sent after the outage was over here, and after any still queued would have timed out.
    after = max(cleared, t1 + run.fed.lease_timeout_ms / 1000)
    resumed = [lease.t - t1 for lease in run.monitor.leases()
               if lease.region == POOL_REGION and lease.t > after]
    measured = [f + 2]  # the first window after the one SIGCONT falls in
    report(fed_results, run, counts, measured, u_capacity(counts, measured),
           fault=(f"coordinator SIGSTOP {boundary(f + 1) - t0:.2f} s before window "
                  f"+{f + 1 - run.first}, SIGCONT {t1 - boundary(f + 1):.2f} s into it; at the "
                  f"stop the pool held {balance} (+{in_transit} landing after; {at_end} at the "
                  f"window's end, {past_end} just past it), the pooled processes' escrow "
                  f"{escrow}; {POOL_REGION} admitted {len(served)} from then until SIGCONT, and "
                  f"{carried} in the new "
                  f"window before any process left the outage, refused there {refused}; "
                  f"placed per window from the stop's: {list(placed.values())} "
                  f"(excess {excess}); in_outage false {cleared - t1:.2f} s after SIGCONT; "
                  f"first {POOL_REGION} lease "
                  + (f"{resumed[0]:.2f} s after it" if resumed else "never")),
           pool_balance_at_stop=balance, in_transit=in_transit, pool_at_end=at_end,
           pool_past_end=past_end,
           escrow_at_stop=escrow,
           served_in_outage=len(served), carried=carried, refused_in_outage=refused,
           excess=excess, cleared_after_s=cleared - t1, outages=[s["outages"] for s in end])
    assert resumed, f"{POOL_REGION} never leased again after SIGCONT\n{run.logs()}"
    assert any(r.allowed and r.region == POOL_REGION and r.sent > cleared for r in records)
    if regional:
        assert all(s["in_outage"] for s in during), during
        assert all(s["outages"] >= 1 for s in end), end
        assert cleared - t1 <= HEALTH_CHECK + 2 * run.fed.lease_timeout_ms / 1000, cleared - t1
        assert len(served) <= balance + escrow + in_transit, (len(served), balance, escrow,
                                                              in_transit)
        if past_end > 0:
            assert carried > 0, f"nothing served past the window (pool {past_end} past its end)"
        assert set(refused) <= {"regional_balance_spent"}, refused
        assert all(i >= f and counts[i].assigned <= LIMIT + allowance for i in over), (
            f"windows over the limit: {[(i, counts[i].assigned) for i in over]}, allowed "
            f"{LIMIT} + {allowance} from window {f} on\n{run.logs()}")
    else:
        assert not over, f"windows over the limit: {[(i, counts[i].assigned) for i in over]}"
        assert all(s["outages"] == 0 and not s["in_outage"] for s in during + end)
        assert carried == 0, f"{carried} admitted past the window in fail-closed"
        assert set(refused) <= {"coordinator_unreachable"}, refused


# Last in the file, so that the pool's scenarios keep the place in the run they had before this
# one was added.
def test_redis_sentinel_failover_after_a_sigkill_of_the_primary(tmp_path, scratch,
                                                               fed_results):
    """A Redis primary, a replica of it and three sentinels (down after 500 ms, quorum 2); the
    regions name the sentinels, not an address. 0.5 windows into a window, SIGKILL of the
    primary; the sentinels promote the replica and the regions find it through them. Until then
    the regions serve their escrow and are refused coordinator_unreachable; the promoted replica
    is another server process (run_id), so the window they first lease from it in is spent
    (coordinator_restarted) whatever it replicated; no window over the limit, the next one at
    full capacity. Recovery: from the kill to the first admission leased from the new primary."""
    primary = scratch(harness.RedisCoordinator(tmp_path / "primary"))
    primary.start()
    harness.redis_cli(primary, "CONFIG", "SET", "repl-diskless-sync-delay", "0")
    replica = scratch(harness.RedisCoordinator(tmp_path / "replica", replica_of=primary.port))
    replica.start()
    harness.wait_until(lambda: "master_link_status:up" in harness.redis_cli(
        replica, "INFO", "replication"), 10, what="the replica in sync")
    sentinels = [scratch(harness.RedisSentinel(tmp_path / f"sentinel-{i}", primary.port))
                 for i in range(3)]
    for s in sentinels:
        s.start()
    harness.wait_until(lambda: harness.sentinels_ready(sentinels, replica), 15,
                       what="every sentinel to know the replica and its quorum")
    coord = harness.SentinelFailover(sentinels, "redis + replica, 3 sentinels")

    def inject(c, run):
        t0 = time.time()
        sleep_until(boundary(window_of(t0, WINDOW)) + KILL_AT * WINDOW)
        before = redis_ledger(primary.port, run)
        killed = time.time()
        primary.kill()
        harness.wait_until(
            lambda: harness.redis_info_says(replica, "replication", "role:master"), 30,
            interval=0.05, what="the sentinels to promote the replica")
        return {"start": t0, "killed": killed, "end": time.time(), "before": before,
                "after": redis_ledger(replica.port, run)}

    run, f, back, times, records, counts = fault_run(tmp_path, coord, "sentinel-failover",
                                                     0.0, inject, 2, LOSS_BACKOFF_MS)
    killed, promoted = times["killed"], times["end"]
    restarted = sorted(r.received for r in records
                       if r.reason == "coordinator_restarted" and r.sent > promoted)
    assert restarted, f"no coordinator_restarted once the replica was promoted\n{run.logs()}"
    spent = window_of(restarted[0], WINDOW)  # the window the new primary counts as spent
    assert spent <= back + 1, (spent, back)
    reasons: Dict[str, int] = {}
    for r in records:
        if killed + GUARD < r.sent and r.received < boundary(spent + 1) - GUARD:
            reasons[r.reason or "admitted"] = reasons.get(r.reason or "admitted", 0) + 1
    assert set(reasons) <= LOSS_REASONS, (reasons, run.logs())
    assert "coordinator_unreachable" in reasons, (reasons, run.logs())
    measured = [spent + 1]
    assert set(counts[spent + 1].refusals) <= {"budget_spent"}, (counts[spent + 1].refusals,
                                                                 run.logs())
    u = u_capacity(counts, measured)
    recovered = min(r.received for r in records
                    if r.allowed and r.sent > promoted and window_of(r.sent, WINDOW) > f)
    report_loss(fed_results, run, counts, f, measured, u, reasons, times,
                f"primary SIGKILL {killed - boundary(f):.2f} s into window +{f - run.first}, "
                f"replica promoted by the sentinels {promoted - killed:.2f} s later, first "
                f"admission leased from it {recovered - killed:.2f} s after the kill",
                promoted_s=promoted - killed, recovered_s=recovered - killed)
    assert u >= U_FLOOR, f"U_capacity after the failover {u:.3f} < {U_FLOOR:.3f}"


# ---- etcd: the leader cut off from its peers ----

ISOLATE_SECONDS = 3.0
ETCD_REASONS = {"budget_spent", "coordinator_unreachable"}


class EtcdRun(Run):
    """The regions on an etcd cluster, region i trying member i first: the last region talks
    to the member in the network namespace."""

    def make_nodes(self, coord: harness.EtcdCluster) -> List[FederatedNode]:
        return [FederatedNode(self.dir, r, sluice_bin(), coord.starting_at(i), self.fed)
                for i, r in enumerate(REGIONS)]

    def __enter__(self) -> "EtcdRun":
        super().__enter__()
        # On etcd a budget with no origin yet is lost up to twice max_clock_offset (its default,
        # 100 ms) past the first caller's clock, which can be the next window too; the load's
        # threads may send their first check a little after this.
        self.first = window_of(time.time() + 0.5, WINDOW) + 1
        return self


def test_etcd_leader_cut_off_from_its_peers(tmp_path, scratch, netns, fed_results):
    """A 3-member etcd cluster whose third member runs in the network namespace, made leader;
    the last region's client starts at it. 0.3 windows into a window, every packet between the
    members' peer ports is dropped for ISOLATE_SECONDS while the regions still reach the cut-off
    member as clients (it answers nothing that needs a quorum: it steps down, and a read or a
    compare-and-swap on it times out). The other two elect a leader; every region, the one
    talking to the cut-off member too, reaches the cluster again before the heal (an admission
    or a budget_spent in a later window than the cut's, whose escrow cannot carry over). Raft
    acknowledges a grant only once a quorum holds it, so nothing is lost: no window is counted
    as spent (no coordinator_restarted), none goes over the limit, the ones after the heal admit
    at full capacity. The unavailability window: from the cut to the last
    coordinator_unreachable any region answered."""
    ns, why = netns
    if ns is None:
        pytest.skip(why)
    cluster = scratch(harness.EtcdCluster(tmp_path / "etcd", ns))
    try:
        cluster.start()
        inside = cluster.members[-1]
        cluster.make_leader(inside)
        others = cluster.members[:-1]

        def inject(c, run):
            t0 = time.time()
            ns.cut([m.peer_port for m in cluster.members])
            harness.wait_until(lambda: cluster.leader(others) is not None, 20, 0.05,
                               "a leader among the two others")
            elected = time.time()
            sleep_until(t0 + ISOLATE_SECONDS)
            dropped = ns.dropped()
            ns.clear()
            return {"start": t0, "elected": elected, "end": time.time(), "dropped": dropped}

        run, f, back, times, records, counts = fault_run(
            tmp_path, cluster, "etcd leader cut off", 0.3, inject, 2, run_type=EtcdRun)
    finally:
        ns.clear()
    t0, elected, t1 = times["start"], times["elected"], times["end"]
    assert times["dropped"] > 0, "nftables dropped no packet: the fault did not happen"
    # From the first window measured: a fresh origin's window is spent, and a check queued on
    # a lease sent before its end may be refused for it just after (a lease takes up to
    # lease_timeout).
    settled = boundary(run.first) + run.fed.lease_timeout_ms / 1000 + GUARD
    reasons: Dict[str, int] = {}
    for r in records:
        if not r.allowed and r.sent >= settled:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
    assert set(reasons) <= ETCD_REASONS, (
        reasons, {i - run.first: c.refusals for i, c in counts.items()}, run.logs())
    unreachable = sorted(r.received for r in records if r.reason == "coordinator_unreachable")
    assert unreachable and t0 < unreachable[0], (
        f"no region was refused coordinator_unreachable after the cut: the fault did not reach "
        f"the regions ({reasons})\n{run.logs()}")
    # Every region reached the majority while the member was still cut off.
    served: Dict[str, float] = {}
    for r in sorted(records, key=lambda r: r.received):
        if (r.region not in served and window_of(r.sent, WINDOW) > window_of(t0, WINDOW)
                and r.received < t1 and (r.allowed or r.reason == "budget_spent")):
            served[r.region] = r.received - t0
    assert set(served) == set(REGIONS), (
        f"regions that reached the cluster again during the cut: {served}\n{run.logs()}")
    measured = list(range(back + 1, back + 3))
    for i in [run.first] + measured:
        assert set(counts[i].refusals) <= {"budget_spent"}, (i, counts[i].refusals, run.logs())
    u = u_capacity(counts, measured)
    window = unreachable[-1] - t0
    report(fed_results, run, counts, measured, u,
           fault=(f"leader {inside.name} (region {REGIONS[-1]}'s first member) cut off from its "
                  f"peers {t0 - boundary(f):.2f} s into window +{f - run.first} for "
                  f"{t1 - t0:.1f} s; the two others elected one {elected - t0:.2f} s after the "
                  f"cut; the last coordinator_unreachable {window:.2f} s after it; each region "
                  f"served from the majority again " + ", ".join(
                      f"{k} {v:.2f} s" for k, v in sorted(served.items()))
                  + f" after it; {times['dropped']} packets dropped"),
           elected_s=elected - t0, unavailable_s=window, served_again_s=served)
    assert u >= U_FLOOR, f"U_capacity after the heal {u:.3f} < {U_FLOOR:.3f}"
