"""A rate policy's hits taken in blocks and spent in the adapter (sluice_client/allowance.py,
``Gate(..., allowance=N)``): the state machine on a clock of the test's own, then a gate on a
real `sluice serve`: most requests admitted with no round trip (the next block asked for in the
background), nothing admitted that the server did not grant, and a block's hits never
outliving their hold."""

from __future__ import annotations

import threading
import time
from typing import Dict, List, Optional

import pytest

from sluice_client import Decision
from sluice_client.adapters import Gate, RequestInfo
from sluice_client.allowance import Allowances

CONFIG = """\
policies:
  hour: {kind: rate, strategy: fixed-window, limit: 25, period: 1h}
  bucket: {kind: rate, strategy: gcra, limit: 20, period: 1s}
  wide: {kind: rate, strategy: fixed-window, limit: 1000000, period: 1h}
"""


def allowed(remaining: int, limit: int = 100) -> Decision:
    return Decision(allowed=True, limit=limit, remaining=remaining, reset_after=1.0,
                    retry_after=0.0)


def refused(retry_after, limit: int = 100) -> Decision:
    return Decision(allowed=False, limit=limit, remaining=0, reset_after=1.0,
                    retry_after=retry_after)


# ---- the state machine ----

class Rules:
    """An :class:`Allowances` read as two steps: :meth:`local` (the decision of
    ``Allowances.spend``) and :meth:`take_refill` (the refill it made due, once)."""

    def __init__(self, *args, **kwargs):
        self.a = Allowances(*args, **kwargs)
        self.due: Dict[str, int] = {}

    def local(self, key: str, hits: int, now: float) -> Optional[Decision]:
        d, due = self.a.spend(key, hits, now)
        if due:
            self.due[key] = due
        return d

    def take_refill(self, key: str) -> int:
        return self.due.pop(key, 0)

    def __getattr__(self, name):
        return getattr(self.a, name)

    def __len__(self) -> int:
        return len(self.a)

def test_a_granted_block_is_spent_here_until_its_hold_ends():
    a = Rules(10, hold=0.5)
    assert a.local("k", 1, 0.0) is None  # nothing held: ask the server
    assert a.ask("k", 1) == 10
    assert a.answered("k", 10, 1, allowed(remaining=90), 0.0) is None
    assert a.held("k") == 9
    for i in range(9):
        d = a.local("k", 1, 0.1)
        assert d is not None and d.allowed
        assert d.remaining == 90 + 8 - i  # the server's figure at the grant, plus what is held
    assert a.local("k", 1, 0.1) is None  # spent: ask again
    assert a.answered("k", 10, 1, allowed(remaining=80), 0.2) is None
    assert a.local("k", 1, 0.69) is not None
    assert a.local("k", 1, 0.70) is None  # 0.5 s after the grant: the rest is dropped
    assert a.held("k") == 0
    assert a.stats["hits_dropped"] == 8
    assert a.stats["local_admits"] == 10 and a.stats["blocks_granted"] == 2


def test_a_request_of_more_hits_than_held_asks_the_server():
    a = Rules(10, hold=1.0)
    assert a.answered("k", 10, 4, allowed(remaining=0), 0.0) is None
    assert a.held("k") == 6
    assert a.local("k", 4, 0.1).allowed
    assert a.local("k", 4, 0.1) is None  # 2 held, 4 wanted
    assert a.ask("k", 12) == 12  # never fewer than the request's own hits


def test_a_block_is_no_larger_than_the_policys_limit():
    a = Rules(50)
    assert a.ask("k", 1) == 50
    a.answered("k", 50, 1, allowed(remaining=0, limit=20), 0.0)
    a.local("k", 1, 10.0)  # expired: dropped
    assert a.ask("k", 1) == 20


def test_a_refused_block_asks_for_what_remains_or_the_requests_own_hits():
    a = Rules(10, hold=1.0)
    # 4 remain: enough for the request, so those are asked for (and held).
    short = Decision(allowed=False, limit=100, remaining=4, reset_after=1.0, retry_after=0.5)
    assert a.answered("k", 10, 1, short, 0.0) == 4
    assert a.answered("k", 4, 1, allowed(remaining=0), 0.0) is None
    assert a.held("k") == 3
    # Fewer remain than the request wants, or the refusal has a reason of its own: its own hits.
    assert a.answered("k", 10, 3, Decision(False, 100, 2, 1.0, 0.5), 0.0) == 3
    assert a.answered("k", 10, 1, Decision(False, 100, 4, 1.0, 0.5, reason="budget_spent"),
                      0.0) == 1
    assert a.local("k", 1, 0.1) is not None  # no refusal cached for a block
    assert a.stats["blocks_refused"] == 3
    # Its own hits refused: refused here until the server's retry_after.
    b = Rules(10, hold=1.0)
    assert b.answered("k", 1, 1, refused(0.5), 0.0) is None
    d = b.local("k", 1, 0.2)
    assert d is not None and not d.allowed
    assert d.retry_after == pytest.approx(0.3)
    assert b.local("k", 1, 0.5) is None  # the retry_after has passed: ask
    assert b.stats["local_refusals"] == 1


def test_a_shadow_answer_grants_no_block():
    a = Rules(10)
    shadow = Decision(allowed=True, limit=100, remaining=50, reset_after=1.0, retry_after=0.5,
                      would_deny=True)
    assert a.answered("k", 10, 1, shadow, 0.0) == 1  # nothing was debited: nothing to hold
    assert a.held("k") == 0
    assert a.answered("k", 1, 1, shadow, 0.0) is None
    assert a.local("k", 1, 0.1) is None


def test_a_refusal_that_never_passes_is_not_cached():
    a = Rules(10)
    assert a.answered("k", 1, 1, refused(None), 0.0) is None
    assert a.local("k", 1, 0.1) is None


def test_the_next_block_is_asked_when_half_is_spent_and_the_older_hits_go_first():
    a = Rules(10, hold=0.5)
    assert a.answered("k", 10, 1, allowed(remaining=90), 0.0) is None  # 9 held
    for i in range(3):
        assert a.local("k", 1, 0.0).allowed and a.take_refill("k") == 0, i
    assert a.local("k", 1, 0.0).allowed  # 5 of 10 left
    assert a.take_refill("k") == 10
    assert a.take_refill("k") == 0  # taken once
    assert a.local("k", 1, 0.0).allowed and a.take_refill("k") == 0  # one refill at a time
    a.refilled("k", 10, allowed(remaining=70), 0.1)
    assert a.held("k") == 14
    d = a.local("k", 2, 0.2)
    assert d.allowed and d.remaining == 70 + 12
    assert a.take_refill("k") == 0  # the older block's hits went first: the new one is whole
    # The older block's last 2 expire with their own hold; the refill's 10 stay until theirs.
    assert a.local("k", 1, 0.55).allowed
    assert a.held("k") == 9
    for i in range(3):
        assert a.local("k", 1, 0.55).allowed and a.take_refill("k") == 0, i
    assert a.local("k", 1, 0.55).allowed and a.take_refill("k") == 10  # half the refill's
    assert a.local("k", 1, 0.6) is None  # its hold is over
    assert a.stats["refills_granted"] == 1 and a.stats["hits_dropped"] == 2 + 5


def test_spend_answers_the_decision_and_a_refill_once_per_block():
    a = Allowances(10, hold=1.0)
    a.answered("k", 10, 1, allowed(remaining=90), 0.0)
    for i in range(9):
        d, due = a.spend("k", 1, 0.0)
        assert d is not None and d.allowed and d.remaining == 90 + 8 - i, i
        assert due == (10 if i == 3 else 0), i
    assert a.spend("k", 1, 0.0) == (None, 0)
    assert a.spend("unknown", 1, 0.0) == (None, 0)


def test_a_refill_that_came_while_a_request_waited_is_kept():
    a = Rules(10, hold=1.0)
    a.answered("k", 10, 1, allowed(remaining=90), 0.0)
    for _ in range(9):
        assert a.local("k", 1, 0.0).allowed
    assert a.take_refill("k") == 10
    assert a.local("k", 1, 0.0) is None  # spent: this request asks
    a.refilled("k", 10, allowed(remaining=5), 0.001)
    short = Decision(allowed=False, limit=100, remaining=5, reset_after=1.0, retry_after=1.0)
    assert a.answered("k", 10, 1, short, 0.002) == 5
    assert a.answered("k", 5, 1, allowed(remaining=0), 0.003) is None
    assert a.held("k") == 14 and a.stats["hits_dropped"] == 0
    # The refill's 10 first: the block granted after it outlives it by its 2 ms.
    for _ in range(10):
        assert a.local("k", 1, 0.5).allowed
    for _ in range(4):
        assert a.local("k", 1, 1.002).allowed
    assert a.local("k", 1, 1.002) is None
    # The request's own hits refused, with a refill's on the way: they are spent when they
    # come, before the refusal's retry_after (they were granted).
    b = Rules(4, hold=1.0)
    b.answered("k", 4, 1, allowed(remaining=1), 0.0)
    assert b.local("k", 1, 0.0).allowed and b.take_refill("k") == 4
    for _ in range(2):
        assert b.local("k", 1, 0.0).allowed
    assert b.answered("k", 4, 1, refused(0.05), 0.0) == 1
    assert b.answered("k", 1, 1, refused(0.05), 0.0) is None
    assert not b.local("k", 1, 0.0).allowed
    b.refilled("k", 4, allowed(remaining=0), 0.001)
    for _ in range(4):
        assert b.local("k", 1, 0.002).allowed
    assert not b.local("k", 1, 0.002).allowed  # refused here again until 0.05


def test_a_refill_not_granted_is_not_asked_again_for_that_block_nor_cached_as_a_refusal():
    a = Rules(4, hold=1.0)
    assert a.answered("k", 4, 1, allowed(remaining=2, limit=6), 0.0) is None  # 3 held
    assert a.local("k", 1, 0.0).allowed and a.take_refill("k") == 4
    a.refilled("k", 4, refused(0.3, limit=6), 0.0)
    for _ in range(2):
        assert a.local("k", 1, 0.0).allowed and a.take_refill("k") == 0
    assert a.local("k", 1, 0.0) is None  # spent: the request asks (no refusal was cached)
    assert a.ask("k", 1) == 4
    assert a.answered("k", 4, 1, allowed(remaining=0, limit=6), 0.0) is None
    assert a.local("k", 1, 0.0).allowed and a.take_refill("k") == 4
    a.refilled("k", 4, None, 0.0)  # no answer came
    assert a.local("k", 1, 0.0).allowed and a.take_refill("k") == 0
    assert a.stats["refills_refused"] == 2 and a.stats["calls_asked"] == 1
    small = Rules(10, hold=1.0)  # a refill is no larger than the policy's limit
    small.answered("k", 6, 1, allowed(remaining=0, limit=6), 0.0)
    assert small.local("k", 1, 0.0).allowed and small.take_refill("k") == 0
    assert small.local("k", 1, 0.0).allowed and small.take_refill("k") == 6  # 3 of 6 left


def test_every_hit_spent_here_was_granted_within_the_hold():
    """Random calls, blocks, refills and answers (seeded): each hit spent here is matched to a
    grant no older than the hold (oldest first, the most any spending could be), and no more
    than two blocks are held."""
    import random
    for seed in range(300):
        rng = random.Random(seed)
        block, hold = rng.randint(1, 11), rng.randint(1, 40) / 1000
        a = Rules(block, hold=hold)
        grants: List[List[float]] = []  # [granted at, hits left]

        def spend(hits: int, now: float) -> None:
            while grants and now - grants[0][0] >= hold:
                grants.pop(0)
            while hits:
                assert grants, f"seed {seed}: a hit spent that no live grant covers"
                n = min(hits, grants[0][1])
                grants[0][1] -= n
                hits -= n
                if not grants[0][1]:
                    grants.pop(0)

        in_flight, now = 0, 0.0
        for _ in range(rng.randint(1, 200)):
            now += rng.randint(0, 7) / 1000
            hits, limit = rng.randint(1, 3), rng.randint(1, 29)
            if in_flight and rng.random() < 0.5:
                kind = rng.randint(0, 2)  # granted, refused, no answer
                if kind == 0:
                    grants.append([now, in_flight])
                a.refilled("k", in_flight,
                           [allowed(limit, limit), refused(0.005), None][kind], now)
                in_flight = 0
            d = a.local("k", hits, now)
            if d is not None:
                if d.allowed:
                    spend(hits, now)
                due = a.take_refill("k")
                if due:
                    assert d.allowed and not in_flight, seed
                    in_flight = due
            else:
                asked = a.ask("k", hits)
                while True:
                    assert asked >= hits
                    grant = rng.random() < 0.5
                    if grant:
                        grants.append([now, asked])
                        answer = allowed(limit, max(limit, asked))
                    else:
                        answer = Decision(False, limit, limit, 1.0, 0.003)
                    following = a.answered("k", asked, hits, answer, now)
                    if following is None:
                        if grant:
                            spend(hits, now)
                        break
                    assert following < asked
                    asked = following
            assert a.held("k") <= 2 * block, seed


def test_keys_past_max_keys_are_asked_every_time_until_the_expired_are_forgotten():
    a = Rules(10, hold=1.0, max_keys=2)
    a.answered("a", 10, 1, allowed(90), 0.0)
    a.answered("b", 10, 1, allowed(90), 0.0)
    assert a.answered("c", 10, 1, allowed(90), 0.5) is None  # granted, no room to hold it
    assert a.held("c") == 0 and len(a) == 2
    assert a.answered("c", 10, 1, refused(5.0), 0.5) == 1  # refused: ask its own hits
    a.answered("c", 10, 1, allowed(90), 2.0)  # a and b expired: forgotten, c held
    assert len(a) == 1 and a.held("c") == 9
    assert a.stats["hits_dropped"] == 18


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_a_block_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="allowance"):
        Allowances(bad)


@pytest.mark.parametrize("bad", [0, -0.1, "1"])
def test_a_hold_must_be_positive(bad):
    with pytest.raises(ValueError, match="allowance_hold"):
        Allowances(10, hold=bad)


def test_a_concurrency_gate_takes_no_allowance():
    with pytest.raises(ValueError, match="allowance: only a rate policy"):
        Gate("p", kind="concurrency", allowance=10)
    with pytest.raises(ValueError, match="allowance"):
        Gate("p", allowance=-3)


# ---- a gate on a real server ----

class Request(RequestInfo):
    def header(self, name):
        return None


def request(path: str = "/k") -> Request:
    return Request("GET", path, None)


@pytest.fixture
def sluice(start_server):
    return start_server(CONFIG)


def checks(client, policy: str) -> int:
    """Decisions the server made on `policy` (allowed and denied)."""
    state = client.policies()[policy].state
    return sum(state.get(k, 0) for k in ("allowed", "denied"))


def wait_refills(gate: Gate) -> None:
    """Until the gate's background refills are answered (each within its timeout)."""
    until = time.monotonic() + 5
    while gate.refills_in_flight() and time.monotonic() < until:
        time.sleep(0.005)
    assert gate.refills_in_flight() == 0


def test_most_requests_are_admitted_without_a_round_trip_and_never_past_the_limit(sluice):
    gate = Gate("hour", target=sluice.grpc_target, allowance=10, allowance_hold=60)
    try:
        verdicts = [gate.enter(request()).admitted for _ in range(40)]
        # A window of 25: blocks of 10 (the second asked in the background when the first was
        # half spent, or by a request if that had not come back), a refused one, then the 5
        # that remained; the 26th request refused by the server, the rest here, until its
        # retry_after. Every request answered once.
        assert verdicts == [True] * 25 + [False] * 15
        wait_refills(gate)
        a = gate.allowances
        assert a.stats["local_admits"] + a.stats["local_refusals"] + a.stats["calls_asked"] == 40
        assert a.stats["local_admits"] >= 20 and a.stats["local_refusals"] >= 10
        assert a.stats["blocks_granted"] + a.stats["refills_granted"] == 3
        refused_here = gate.enter(request())
        assert refused_here.refusal.status == 429
        assert 0 < refused_here.refusal.retry_after <= 3600
        assert gate.stats["admitted"] == 25 and gate.stats["refused"] == 16
    finally:
        gate.close()


def test_a_keys_steady_requests_wait_for_no_check_after_the_first(sluice):
    """Blocks of 20, a request every millisecond or so (a handler's time): each block after the
    first is asked for in the background when half of the one before is spent. Without that,
    every 20th request would wait for a Check."""
    gate = Gate("wide", target=sluice.grpc_target, allowance=20, allowance_hold=60)
    try:
        for i in range(200):
            assert gate.enter(request("/steady")).admitted, i
            time.sleep(0.001)
        wait_refills(gate)
        a = gate.allowances
        assert a.stats["calls_asked"] <= 3, a.stats  # 1, unless a refill came back late
        assert a.stats["refills_granted"] >= 7, a.stats
        assert a.stats["local_admits"] + a.stats["calls_asked"] == 200
        assert checks(sluice.client(), "wide") == a.stats["calls_asked"] + a.stats[
            "refills_granted"]
    finally:
        gate.close()


def test_gates_sharing_a_key_together_admit_no_more_than_the_server_grants(sluice):
    gates = [Gate("hour", target=sluice.grpc_target, allowance=10) for _ in range(3)]
    admitted: List[int] = [0, 0, 0]

    def run(i: int) -> None:
        for _ in range(30):
            admitted[i] += gates[i].enter(request("/shared")).admitted

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(admitted) <= 25, admitted  # never more than the window's 25
        # All 25 were granted (a request of one hit was refused); each of them was spent by a
        # request, dropped when its hold ran out, or is held still: none lost otherwise.
        for g in gates:
            wait_refills(g)
        dropped = sum(g.allowances.stats["hits_dropped"] + g.allowances.held("GET /shared")
                      for g in gates)
        assert sum(admitted) + dropped == 25, (admitted, dropped)
    finally:
        for g in gates:
            g.close()


def test_hits_held_past_their_hold_are_not_spent_on_the_next_refill(sluice):
    """GCRA, 20 a second: one request takes a block of 10 (9 held), the bucket refills while
    they wait; then a burst. Without the hold, the 9 would come on top of the refilled bucket."""
    gate = Gate("bucket", target=sluice.grpc_target, allowance=10, allowance_hold=0.05)
    try:
        assert gate.enter(request()).admitted
        assert gate.allowances.held("GET /k") == 9
        time.sleep(1.2)  # the bucket is whole again; the 9 are 1.2 s old
        start = time.monotonic()
        burst = sum(gate.enter(request()).admitted for _ in range(60))
        took = time.monotonic() - start
        # The bucket's 20, what it refills during the burst (20/s), and what the blocks granted
        # during it may still hold at its end (two blocks: their hold): nothing from before.
        assert burst <= 20 + 20 * (took + 0.05) + 1, (burst, took)
        assert burst >= 20
        assert gate.allowances.stats["hits_dropped"] >= 9
    finally:
        gate.close()


def test_every_block_is_counted_by_the_server_once(sluice):
    client = sluice.client()
    gate = Gate("hour", target=sluice.grpc_target, allowance=5, allowance_hold=60)
    try:
        for _ in range(12):
            assert gate.enter(request("/counted")).admitted
        wait_refills(gate)
        # Blocks of 5, asked by a request or in the background: one decision each.
        a = gate.allowances.stats
        blocks = a["blocks_granted"] + a["refills_granted"]
        assert checks(client, "hour") == a["calls_asked"] + a["refills_granted"] + a[
            "refills_refused"]
        assert blocks >= 3 and a["hits_dropped"] == 0
        assert gate.allowances.held("GET /counted") == 5 * blocks - 12
        assert client.peek("hour", "GET /counted").remaining == max(0, 25 - 5 * blocks - 1)
    finally:
        gate.close()
