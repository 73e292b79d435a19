"""A client of the server's throttler check API, for batch jobs that work in chunks.

The throttler is collaborative (the Vitess tablet throttler / freno pattern): nothing stands
between the job and the database it protects; the job asks before each chunk of work and holds
back while the answer is "no"::

    from sluice_client import ThrottlerClient, run_in_chunks

    with ThrottlerClient("http://127.0.0.1:8080", app="purge", shard="main") as throttler:
        def chunk() -> bool:
            deleted = delete_some_rows(limit=100)    # small enough to not hurt between checks
            return deleted == 100                     # True: more work remains
        stats = run_in_chunks(throttler, chunk, deadline_per_chunk=600)

One check is ``GET /throttler/check?app=APP[&scope=self|shard][&shard=S][&p=low]``; the status
code is the answer: 200 go ahead; 429 a metric is over its threshold (or its probe failed or is
stale: the server fails closed); 417 an operator throttled the app; 404 an unknown metric or
shard; 400 a malformed argument; 5xx the server failed. The JSON body says why
(``reason``, ``value``, ``threshold``, ``MetricName``, ``Message``).

Only the standard library is used here (:mod:`http.client`); the timing helpers take their clock
and sleep as arguments, so tests (and simulations) run without sleeping.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import grpc

from .errors import SluiceError

__all__ = [
    "CheckResult",
    "ThrottlerClient",
    "Backoff",
    "ChunkStats",
    "ThrottledTimeout",
    "wait_until_allowed",
    "run_in_chunks",
]

# What a refusal means when the body does not say (an older server, or a freno-style one).
_REASON_BY_STATUS = {
    200: "ok",
    400: "bad_request",
    404: "not_found",
    417: "app_throttled",
    429: "threshold_exceeded",
}

# The errors that mean "the server closed the kept-alive connection": worth one reconnect.
_DROPPED = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError,
            http.client.BadStatusLine)  # RemoteDisconnected is both of the first and the last

_ON_UNREACHABLE = ("hold", "proceed")
_SCOPES = ("self", "shard")


@dataclass(frozen=True)
class CheckResult:
    """The throttler's answer to one check.

    Attributes:
        ok: go ahead with one chunk of work. ``False``: hold back and ask again later.
        status: the HTTP status (200, 429, 417, 404, 400, 5xx...), or 0 when the throttler could
            not be reached at all (connection refused, a timeout, a dropped connection).
        reason: the body's ``reason`` (``"ok"``, ``"exempt"``, ``"threshold_exceeded"``,
            ``"probe_failed"``, ``"stale_sample"``, ``"no_sample"``, ``"low_priority"``,
            ``"app_throttled"``, ``"unknown_metric"``, ...); when the throttler
            could not be asked -- no answer, a 5xx, or an answer that is not its JSON --
            ``"unreachable: <why>"`` (then ``ok`` is the client's ``on_unreachable`` policy).
        value: the deciding metric's value, when the body has one.
        threshold: that metric's threshold, when the body has one.
        metric: the deciding metric's name (the body's ``MetricName``), when it has one.
        message: the server's ``Message``, or what went wrong when it could not be asked.
    """

    ok: bool
    status: int
    reason: str
    value: Optional[float] = None
    threshold: Optional[float] = None
    metric: Optional[str] = None
    message: str = ""

    @property
    def unreachable(self) -> bool:
        """True when this is not the throttler's answer but the ``on_unreachable`` policy's."""
        return self.reason.startswith("unreachable:")


def _number(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _first_number(body: Mapping[str, Any], *keys: str) -> Optional[float]:
    for key in keys:
        n = _number(body.get(key))
        if n is not None:
            return n
    return None


def _finite_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: must be a number of seconds, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, not {value!r}")
    return float(value)


class ThrottlerClient:
    """Asks one sluice server's throttler whether an app may do its next chunk of work.

    Args:
        url: the server's HTTP base, ``"http://HOST:PORT"`` (a path prefix, as behind a proxy,
            is kept: ``"http://gw/sluice"`` checks ``/sluice/throttler/check``). Only
            ``http://``.
        app: the app's name (``"purge"``, ``"gh-ost"``): the server's per-app rules, exemptions
            and operator throttles (417) key on it.
        shard: ask about this shard (``&shard=S``; the server answers 404 for one it does not
            know). ``None``: the server's own.
        scope: ``"self"`` (this host's metrics only) or ``"shard"`` (the shard's); ``None``:
            the server's default.
        low_priority: send ``p=low``: the server refuses this app (``"low_priority"``) for a
            while after it refused any normal-priority one, so urgent work goes first.
        timeout: seconds for connecting and for each read of one check.
        on_unreachable: what a check answers when the throttler cannot be asked (refused
            connection, timeout, a 5xx, an answer that is not JSON): ``"hold"`` (``ok=False``,
            the default) or ``"proceed"`` (``ok=True``).

    Why ``"hold"`` by default: a throttler you cannot ask is a throttler saying no. The
    throttler and the database it protects often fail together -- the host is overloaded, the
    network is partitioned, the database is down and the throttler's probes with it -- and a
    batch job that charges on exactly then is the load the throttler exists to stop. Choose
    ``"proceed"`` only for work that must not stall on the throttler's availability and is
    harmless when the database is struggling.

    Refusals and failures are answers (:class:`CheckResult`), never exceptions; only bad
    arguments raise (:class:`ValueError`, :class:`TypeError`). One keep-alive connection is
    reused across checks (reopened once when the server dropped it while idle). A client may be
    shared between threads (checks take turns on the connection); :meth:`close` it, or use it as
    a context manager.
    """

    def __init__(self, url: str, app: str, *, shard: Optional[str] = None,
                 scope: Optional[str] = None, low_priority: bool = False, timeout: float = 1.0,
                 on_unreachable: str = "hold"):
        self._host, self._port, prefix = _parse_url(url)
        if not isinstance(app, str) or not app:
            raise ValueError(f"app: must be a non-empty string, not {app!r}")
        if shard is not None and (not isinstance(shard, str) or not shard):
            raise ValueError(f"shard: must be a non-empty string or None, not {shard!r}")
        if scope is not None and scope not in _SCOPES:
            raise ValueError(f"scope: must be 'self', 'shard' or None, not {scope!r}")
        timeout = _finite_number(timeout, "timeout")
        if timeout <= 0:
            raise ValueError(f"timeout: must be > 0 seconds, not {timeout!r}")
        if on_unreachable not in _ON_UNREACHABLE:
            raise ValueError(f"on_unreachable: must be 'hold' or 'proceed', not "
                             f"{on_unreachable!r}")

        self.url = url
        self.app = app
        self.shard = shard
        self.scope = scope
        self.low_priority = bool(low_priority)
        self.timeout = timeout
        self.on_unreachable = on_unreachable

        query: Dict[str, str] = {"app": app}
        if scope is not None:
            query["scope"] = scope
        if shard is not None:
            query["shard"] = shard
        if self.low_priority:
            query["p"] = "low"
        self._target = f"{prefix}/throttler/check?{urllib.parse.urlencode(query)}"
        self._conn: Optional[http.client.HTTPConnection] = None
        self._lock = threading.Lock()

    # ---- lifecycle ----

    def close(self) -> None:
        """Closes the kept-alive connection. A later check opens a new one."""
        with self._lock:
            self._drop_connection()

    def __enter__(self) -> "ThrottlerClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ThrottlerClient({self.url!r}, app={self.app!r})"

    # ---- checking ----

    def check(self) -> CheckResult:
        """Asks once. Never raises for an HTTP or network failure: see :class:`CheckResult`."""
        with self._lock:
            try:
                status, body = self._get()
            except (OSError, http.client.HTTPException) as exc:
                # OSError: refused, unresolvable, timed out (TimeoutError), reset...
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                return self._unreachable(0, why, f"cannot reach the throttler at {self.url}: "
                                                 f"{why}")
        return self._result(status, body)

    def _get(self) -> Tuple[int, bytes]:
        """One GET of the check target: (status, body). Raises OSError / HTTPException."""
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self.timeout)
            # An open socket has served a check before: the server may have closed it since
            # (an idle timeout, a restart). Only then is a failure worth one more try.
            reused = self._conn.sock is not None
            try:
                self._conn.request("GET", self._target, headers={
                    "Accept": "application/json",
                    "User-Agent": "sluice-client-python/throttler",
                })
                response = self._conn.getresponse()
                return response.status, response.read()
            except _DROPPED:
                self._drop_connection()
                if reused and attempt == 1:
                    continue
                raise
            except BaseException:
                self._drop_connection()  # a timeout or an interrupt leaves it mid-exchange
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _unreachable(self, status: int, why: str, message: str) -> CheckResult:
        return CheckResult(ok=self.on_unreachable == "proceed", status=status,
                           reason=f"unreachable: {why}", message=message)

    def _result(self, status: int, raw: bytes) -> CheckResult:
        body: Optional[Mapping[str, Any]] = None
        try:
            parsed = json.loads(raw)
            if isinstance(parsed, dict):
                body = parsed
        except ValueError:  # not JSON, or not UTF-8
            pass
        if status >= 500:
            detail = (body or {}).get("Message") or raw[:200].decode("utf-8", "replace").strip()
            why = f"HTTP {status}" + (f": {detail}" if detail else "")
            return self._unreachable(status, why, f"the throttler at {self.url} failed: {why}")
        if body is None:
            # Every answer of the throttler's (but HEAD's) is a JSON object: this one is from
            # something else -- a proxy's error page, a URL that is not a sluice server.
            snippet = raw[:80].decode("utf-8", "replace")
            why = f"HTTP {status} answer is not a JSON object: {snippet!r}"
            return self._unreachable(status, why, f"the answer from {self.url} is not the "
                                                  f"throttler's: {why}")
        reason = body.get("reason")
        if not isinstance(reason, str) or not reason:
            reason = _REASON_BY_STATUS.get(status, f"http_{status}")
        value = _first_number(body, "value", "Value")
        threshold = _first_number(body, "threshold", "Threshold")
        metric = body.get("MetricName")
        message = body.get("Message")
        return CheckResult(ok=status == 200, status=status, reason=reason, value=value,
                           threshold=threshold,
                           metric=metric if isinstance(metric, str) and metric else None,
                           message=message if isinstance(message, str) else "")


def _parse_url(url: str) -> Tuple[str, Optional[int], str]:
    """``"http://host:port/prefix"`` -> (host, port, prefix without a trailing slash)."""
    if not isinstance(url, str):
        raise ValueError(f"url: must be a string like 'http://127.0.0.1:8080', not {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"url: must start with http:// (e.g. 'http://127.0.0.1:8080'), "
                         f"not {url!r}")
    if not parts.hostname:
        raise ValueError(f"url: has no host: {url!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"url: must be the server's base, without credentials, a query or a "
                         f"fragment, not {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"url: bad port in {url!r}") from None
    return parts.hostname, port, parts.path.rstrip("/")


class Backoff:
    """The delays between refused checks: bounded exponential, jittered, floored.

    The n-th delay since the last :meth:`reset` is ``min(cap, initial * factor**n)`` times a
    uniform factor in ``[1 - jitter, 1 + jitter]``, and never below ``min_interval``. With the
    defaults: about 1 s, 2 s, 4 s, 4 s, ... (each +-20 %).

    Args:
        initial: the first delay, seconds (> 0).
        factor: each delay's multiple of the one before (>= 1).
        cap: the longest delay before jitter, seconds (>= initial).
        jitter: the spread, in [0, 1): jobs refused at the same moment spread out instead of
            all asking again at once when the throttler opens.
        min_interval: the shortest delay, seconds (>= 0): the throttled metric's sampling
            interval. Asking faster than the throttler samples learns nothing new and only
            loads it.
        rng: the random source (``random.Random(seed)`` for reproducible delays); ``None``:
            a new ``random.Random()``.
    """

    def __init__(self, initial: float = 1.0, factor: float = 2.0, cap: float = 4.0,
                 jitter: float = 0.2, min_interval: float = 0.1,
                 rng: Optional[random.Random] = None):
        initial = _finite_number(initial, "initial")
        factor = _finite_number(factor, "factor")
        cap = _finite_number(cap, "cap")
        jitter = _finite_number(jitter, "jitter")
        min_interval = _finite_number(min_interval, "min_interval")
        if initial <= 0:
            raise ValueError(f"initial: must be > 0 seconds, not {initial!r}")
        if factor < 1:
            raise ValueError(f"factor: must be >= 1, not {factor!r}")
        if cap < initial:
            raise ValueError(f"cap: must be >= initial ({initial!r}), not {cap!r}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter: must be in [0, 1), not {jitter!r}")
        if min_interval < 0:
            raise ValueError(f"min_interval: must be >= 0 seconds, not {min_interval!r}")
        self.initial = initial
        self.factor = factor
        self.cap = cap
        self.jitter = jitter
        self.min_interval = min_interval
        self._rng = rng if rng is not None else random.Random()
        self._base = initial

    def next_delay(self) -> float:
        """The next delay, seconds; each call moves one step up towards the cap."""
        base = self._base
        self._base = min(self.cap, base * self.factor)
        spread = self._rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return max(self.min_interval, base * spread)

    def reset(self) -> None:
        """Back to the first delay: call after an allowed check."""
        self._base = self.initial

    def __repr__(self) -> str:
        return (f"Backoff(initial={self.initial}, factor={self.factor}, cap={self.cap}, "
                f"jitter={self.jitter}, min_interval={self.min_interval})")


@dataclass
class ChunkStats:
    """What :func:`run_in_chunks` did.

    Attributes:
        chunks: calls of the chunk function (all that ran, including the last).
        checks: throttler checks made.
        refusals: checks that were not ok.
        waited_seconds: the sum of the delays slept between refused checks.
        max_value_seen: the largest metric value any check reported, ``None`` if none did.
    """

    chunks: int = 0
    checks: int = 0
    refusals: int = 0
    waited_seconds: float = 0.0
    max_value_seen: Optional[float] = None

    def _saw(self, result: CheckResult) -> None:
        self.checks += 1
        if not result.ok:
            self.refusals += 1
        if result.value is not None and (self.max_value_seen is None
                                         or result.value > self.max_value_seen):
            self.max_value_seen = result.value


class ThrottledTimeout(SluiceError):
    """The throttler did not allow the work before the deadline.

    Attributes:
        result: the last :class:`CheckResult` (its ``reason``, ``value`` and ``threshold`` say
            what held the work back; ``result.unreachable``: the throttler could not be asked).
        deadline: the deadline that passed, seconds.
        stats: from :func:`run_in_chunks`, the :class:`ChunkStats` up to the timeout (the chunk
            that was waiting did not run); ``None`` from :func:`wait_until_allowed`.

    A :class:`~sluice_client.SluiceError` with ``code`` ``DEADLINE_EXCEEDED``, but on purpose
    not a :class:`TimeoutError`: a ``client.lease()`` block reports a ``TimeoutError`` as a
    call the backend dropped (lowering an adaptive limit), and waiting on the throttler says
    nothing about that backend.
    """

    code = grpc.StatusCode.DEADLINE_EXCEEDED

    def __init__(self, result: CheckResult, deadline: float,
                 stats: Optional[ChunkStats] = None):
        what = f"{result.reason}"
        if result.metric is not None and result.value is not None:
            what += f", {result.metric}={result.value:g}"
            if result.threshold is not None:
                what += f" (threshold {result.threshold:g})"
        super().__init__(f"still throttled after {deadline:g} s (last check: HTTP "
                         f"{result.status}, {what})")
        self.field = None
        self.result = result
        self.deadline = deadline
        self.stats = stats


OnWait = Callable[[CheckResult, float], None]


def _wait(client: ThrottlerClient, deadline: float, backoff: Backoff,
          clock: Callable[[], float], sleep: Callable[[float], None], on_wait: Optional[OnWait],
          stats: ChunkStats, name: str) -> CheckResult:
    """wait_until_allowed's loop, counting into `stats`; `name` is the deadline's argument."""
    deadline = _finite_number(deadline, name)
    if deadline < 0:
        raise ValueError(f"{name}: must be >= 0 seconds, not {deadline!r}")
    end = clock() + deadline
    while True:
        result = client.check()
        stats._saw(result)
        if result.ok:
            backoff.reset()
            return result
        remaining = end - clock()
        if remaining <= 0:
            raise ThrottledTimeout(result, deadline)
        # Never past the deadline: a last check right at it, rather than a sleep beyond it.
        delay = min(backoff.next_delay(), remaining)
        if on_wait is not None:
            on_wait(result, delay)
        stats.waited_seconds += delay
        sleep(delay)


def wait_until_allowed(client: ThrottlerClient, *, deadline: float,
                       backoff: Optional[Backoff] = None,
                       clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep,
                       on_wait: Optional[OnWait] = None) -> CheckResult:
    """Checks until the throttler allows the work, and returns that ok :class:`CheckResult`.

    Each refusal sleeps ``backoff.next_delay()`` seconds (a new :class:`Backoff` when ``None``),
    cut short so as never to sleep past the deadline, and checks again; an ok check resets the
    backoff. A check that is refused once ``deadline`` seconds (from now, by ``clock``) have
    passed raises :class:`ThrottledTimeout` with that last result. ``deadline=0``: check once.

    ``on_wait(result, delay)`` is called before each sleep (to log why the job waits).
    ``clock`` and ``sleep`` are injectable, e.g. a fake clock that ``sleep`` advances.

    Every non-ok answer is waited out, 400 and 404 too: they mean a bad argument or an unknown
    shard or metric, which waiting will not fix, so keep the deadline finite.
    """
    return _wait(client, deadline, backoff if backoff is not None else Backoff(), clock, sleep,
                 on_wait, ChunkStats(), "deadline")


def run_in_chunks(client: ThrottlerClient, chunk: Callable[[], bool], *,
                  deadline_per_chunk: float, backoff: Optional[Backoff] = None,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep,
                  on_wait: Optional[OnWait] = None) -> ChunkStats:
    """Runs a job in chunks, asking the throttler before each: the collaborative loop.

    Before each call of ``chunk()``, :func:`wait_until_allowed` (with ``deadline_per_chunk``
    seconds, the shared ``backoff`` -- reset after each allowed check -- ``clock``, ``sleep``
    and ``on_wait``). ``chunk()`` does one unit of work and returns ``True`` when more work
    remains, ``False`` when the job is done (anything but a bool raises :class:`TypeError`: a
    forgotten ``return`` would otherwise end the job silently).

    Returns the :class:`ChunkStats`. Raises :class:`ThrottledTimeout` (its ``stats`` filled in)
    when one chunk's wait passes its deadline; whatever ``chunk()`` raises propagates.
    """
    stats = ChunkStats()
    backoff = backoff if backoff is not None else Backoff()
    while True:
        try:
            _wait(client, deadline_per_chunk, backoff, clock, sleep, on_wait, stats,
                  "deadline_per_chunk")
        except ThrottledTimeout as exc:
            exc.stats = stats
            raise
        more = chunk()
        stats.chunks += 1
        if not isinstance(more, bool):
            raise TypeError(f"chunk: must return True (more work remains) or False (done), "
                            f"not {more!r}")
        if not more:
            return stats
