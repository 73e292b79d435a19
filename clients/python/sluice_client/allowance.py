"""A rate policy's hits taken from the server in blocks and spent here: what lets an adapter
admit most requests without a round trip (``Gate(..., allowance=N)``).

The server is asked for ``N`` hits at once (one ``Check`` of ``hits=N``); the requests after it
spend them here, each within ``hold`` seconds of the answer that granted them, after which what
is left is dropped. When a request leaves half of a block or less, the next block is asked for
in the background (a refill: :meth:`Allowances.spend` says how many hits, the answer goes to
:meth:`Allowances.refilled`), so that a key's steady requests do not wait for a ``Check``
when a block runs out; the older block's hits are spent first, each still within ``hold`` of
its own grant, and a refill the server does not grant is not asked again for that block. A key
the server refused is refused here until its ``retry_after`` (a refusal is always safe to
repeat), but for hits held: they were granted, and are spent first. When a block a request
waits for is refused, the request asks for its own hits (the exact answer it would have had
without an allowance), or for what the server says remains when that is enough, so near the
limit nothing is lost but a round trip.

What it can cost, and nothing else:

* **No hit is spent that the server did not grant**, and each is spent at most ``hold`` after
  the grant. So in any interval of T seconds the requests admitted through every allowance
  together are at most what the policy grants in T + ``hold``: for a rate of r hits a second,
  r x ``hold`` more than the policy alone would in T (a fixed window: the hits granted in a
  window's last ``hold`` may be spent in the first ``hold`` of the next).
* Hits not spent within ``hold`` of their grant are lost to every client. At most two blocks
  are held per key, one refill is in flight at a time and hits are spent oldest first, so at
  most two blocks per key, per gate, per ``hold`` are lost. Choose ``N`` no larger than a
  gate's requests per key in ``hold``.
* The ``remaining`` a locally admitted request reports is the server's figure at the grant,
  plus the hits still held here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Dict, Optional, Tuple

from .types import Decision

__all__ = ["Allowances"]


@dataclass
class _Key:
    tokens: int = 0           # the newest block's hits not yet spent
    expires: float = 0.0      # monotonic seconds: tokens are dropped from then
    granted: int = 0          # the newest block's size
    refill_asked: bool = False  # for the newest block
    refilling: bool = False   # a refill is in flight (one at a time)
    older_tokens: int = 0     # the block before the newest, spent first
    older_expires: float = 0.0
    refused_until: float = 0.0
    refusal: Optional[Decision] = None  # the server's refusal of a request's own hits
    decision: Optional[Decision] = None  # the server's last answer for the key


class Allowances:
    """Per-key blocks of hits granted by a rate policy (thread-safe).

    Arguments:
        block: hits asked for at once (>= 1; 1 is no allowance: every request is asked).
        hold: seconds a granted hit may wait to be spent (> 0).
        max_keys: keys remembered at once; past it, the expired ones are forgotten, and a key
            that finds no room is asked every time (no allowance, no refusal cached).
    """

    def __init__(self, block: int, hold: float = 0.05, max_keys: int = 10000):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"allowance: must be an int >= 1 (hits taken at once), not {block!r}")
        if not isinstance(hold, (int, float)) or isinstance(hold, bool) or not hold > 0:
            raise ValueError(f"allowance_hold: must be > 0 seconds, not {hold!r}")
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys: must be an int >= 1, not {max_keys!r}")
        self.block, self.hold, self.max_keys = block, float(hold), max_keys
        self._keys: Dict[str, _Key] = {}
        self._lock = threading.Lock()
        self.stats: Dict[str, int] = dict.fromkeys(
            ("local_admits", "local_refusals", "blocks_granted", "blocks_refused",
             "hits_dropped", "calls_asked", "refills_granted", "refills_refused"), 0)

    def spend(self, key: str, hits: int, now: float) -> Tuple[Optional[Decision], int]:
        """The decision made here for `hits` on `key` at `now` (monotonic seconds), and the hits
        of a refill to ask the server for now, in the background (0: none; its answer goes to
        :meth:`refilled`). The decision: allowed from the hits held (debited, the older block's
        first), or refused until the server's retry_after; ``None``: the server must be
        asked."""
        with self._lock:
            return self._spend(key, hits, now)

    def _spend(self, key: str, hits: int, now: float) -> Tuple[Optional[Decision], int]:
        k = self._keys.get(key)
        if k is None:
            return None, 0
        if now >= k.expires:  # the older block expired first
            self._drop(k)
        elif now >= k.older_expires:
            self.stats["hits_dropped"] += k.older_tokens
            k.older_tokens = 0
        if k.older_tokens + k.tokens < hits:
            if now >= k.refused_until or k.refusal is None:
                return None, 0
            self.stats["local_refusals"] += 1  # hits held are spent first: they were granted
            return replace(k.refusal, retry_after=k.refused_until - now), 0
        older = min(k.older_tokens, hits)
        k.older_tokens -= older
        k.tokens -= hits - older
        self.stats["local_admits"] += 1
        d = k.decision
        due = 0
        if not k.refill_asked and not k.refilling and k.granted > 1 and k.tokens * 2 <= k.granted:
            k.refill_asked = k.refilling = True
            limit = d.limit if d is not None else 0
            due = min(self.block, limit) if limit > 0 else self.block
        return Decision(allowed=True, limit=d.limit if d else 0,
                        remaining=(d.remaining if d else 0) + k.older_tokens + k.tokens,
                        reset_after=d.reset_after if d else 0.0, retry_after=0.0), due

    def refilled(self, key: str, asked: int, d: Optional[Decision], now: float) -> None:
        """Records the answer `d` to a refill of `asked` hits (``None``: none came). Granted,
        it is the key's block from now; the hits left of the one before are spent first, until
        their own hold ends."""
        granted = d is not None and d.allowed and not d.would_deny
        with self._lock:
            k = self._keys.get(key)
            if k is not None:
                k.refilling = False
            if not granted:
                self.stats["refills_refused"] += 1
                return
            self.stats["refills_granted"] += 1
            if k is None:  # forgotten meanwhile (max_keys): nowhere to hold them
                self.stats["hits_dropped"] += asked
                return
            k.decision = d
            self._push(k, asked, asked, now)

    def ask(self, key: str, hits: int) -> int:
        """Hits to ask the server for, for a request of `hits`: a block (no more than the
        policy's limit, when known), never fewer than `hits`."""
        with self._lock:
            self.stats["calls_asked"] += 1
            k = self._keys.get(key)
            limit = k.decision.limit if k is not None and k.decision is not None else 0
        want = max(hits, self.block)
        if limit > 0:
            want = min(want, limit)
        return max(want, hits)

    def answered(self, key: str, asked: int, hits: int, d: Decision,
                 now: float) -> Optional[int]:
        """Records the server's answer `d` to a check of `asked` hits for a request of `hits`
        at `now`. Returns ``None`` when the request has its answer (`d`), else the hits to ask
        for next: a block that was not granted (refused, or allowed only in shadow) is asked
        again as what the server says remains, when that is enough for the request, and as the
        request's own hits otherwise."""
        granted = d.allowed and not d.would_deny
        with self._lock:
            k = self._keys.get(key)
            if k is None:
                if len(self._keys) >= self.max_keys:
                    self._forget_expired(now)
                if len(self._keys) >= self.max_keys:  # no room: asked every time
                    return None if granted or asked == hits else hits
                k = self._keys[key] = _Key()
            k.decision = d
            if granted:
                if asked > hits:
                    self._push(k, asked - hits, asked, now)
                    self.stats["blocks_granted"] += 1
                return None
            if asked > hits:
                self.stats["blocks_refused"] += 1
                if not d.would_deny and not d.reason and hits <= d.remaining < asked:
                    return d.remaining
                return hits
            if not d.allowed and d.retry_after is not None and d.retry_after > 0:
                k.refused_until, k.refusal = now + d.retry_after, d
            return None

    def held(self, key: str) -> int:
        """Hits held for `key` now (expired ones included until the next look)."""
        with self._lock:
            k = self._keys.get(key)
            return k.older_tokens + k.tokens if k is not None else 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)

    def _push(self, k: _Key, tokens: int, granted: int, now: float) -> None:
        """A block of `tokens` left of `granted`, granted at `now`, is the key's newest; what
        is left of the one before it (a refill that came while a request waited for this one)
        is spent first."""
        self.stats["hits_dropped"] += k.older_tokens  # fewer than a request's hits, or expired
        k.older_tokens = 0
        if now < k.expires:
            k.older_tokens, k.older_expires, k.tokens = k.tokens, k.expires, 0
        self.stats["hits_dropped"] += k.tokens
        k.tokens, k.granted = tokens, granted
        k.refill_asked = False
        k.expires = now + self.hold

    def _drop(self, k: _Key) -> None:
        self.stats["hits_dropped"] += k.older_tokens + k.tokens
        k.older_tokens = k.tokens = 0

    def _forget_expired(self, now: float) -> None:
        gone = [key for key, k in self._keys.items()
                if now >= k.expires and now >= k.refused_until]
        for key in gone:
            self._drop(self._keys.pop(key))
