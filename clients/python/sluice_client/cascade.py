"""The fallback cascade on the client side: how a reply or an exception maps to the outcome a
cascade policy is told, and the retry budget that keeps a caller's retries to a share of its
calls.

Used by :meth:`sluice_client.Client.cascade`, which picks a node (Admit on a ``cascade``
policy), calls it, and reports how the call went (Release)."""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Deque, Optional, Tuple

__all__ = ["outcome_of_http", "outcome_of_grpc", "outcome_for_exception", "RetryBudget",
           "CASCADE_OUTCOMES"]

# What a cascade policy is told of a call (Release's outcome): "success"; "timeout" and
# "overload" (a fast refusal as overloaded: HTTP 429/503, gRPC RESOURCE_EXHAUSTED or
# UNAVAILABLE), both a drop to the node's limit and a failure to its health -- never a cheap
# success, or a shedding node would attract more calls; "failed" (an error that says nothing of
# load); "ignored" (nothing about the node: the caller gave up).
CASCADE_OUTCOMES = ("success", "timeout", "overload", "failed", "ignored")


def outcome_of_http(status: int) -> str:
    """429 and 503 overload; 408 and 504 timeout; any other 5xx failed; else success (a 4xx is
    the caller's error: the node answered)."""
    if status in (429, 503):
        return "overload"
    if status in (408, 504):
        return "timeout"
    if status >= 500:
        return "failed"
    return "success"


_GRPC = {8: "overload", 14: "overload", 4: "timeout", 1: "ignored", 2: "failed", 12: "failed",
         13: "failed", 15: "failed"}


def outcome_of_grpc(code) -> str:
    """A gRPC status code (an int, or a ``grpc.StatusCode``): RESOURCE_EXHAUSTED and
    UNAVAILABLE overload; DEADLINE_EXCEEDED timeout; CANCELLED ignored; UNKNOWN, UNIMPLEMENTED,
    INTERNAL and DATA_LOSS failed; OK and the caller's own errors success."""
    value = getattr(code, "value", code)
    if isinstance(value, tuple):  # grpc.StatusCode's value is (int, name)
        value = value[0]
    return _GRPC.get(int(value), "success")


def outcome_for_exception(exc: BaseException) -> str:
    """The outcome of a call that raised `exc`: a TimeoutError is a timeout; an exception that
    carries an HTTP status (``status`` or ``status_code``) or a gRPC code (``code()``) is read
    as such; anything else that is an Exception failed; KeyboardInterrupt and the like say
    nothing about the node (ignored)."""
    if not isinstance(exc, Exception):
        return "ignored"
    if isinstance(exc, TimeoutError):
        return "timeout"
    for attr in ("status", "status_code"):
        status = getattr(exc, attr, None)
        if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
            outcome = outcome_of_http(status)
            return "failed" if outcome == "success" else outcome
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            outcome = outcome_of_grpc(code())
        except Exception:  # noqa: BLE001 - not a gRPC error after all
            return "failed"
        return "failed" if outcome == "success" else outcome
    return "failed"


class RetryBudget:
    """Retries allowed while, over the last `window` seconds,
    ``retries <= ratio * calls + per_second * window`` (calls are first attempts), so retrying
    cannot multiply the load on a failing backend. Thread-safe."""

    def __init__(self, ratio: float = 0.1, per_second: float = 10.0, window: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        if not 0 <= ratio <= 1:
            raise ValueError(f"ratio: must be 0..1, not {ratio!r}")
        if per_second < 0:
            raise ValueError(f"per_second: must be >= 0, not {per_second!r}")
        if window <= 0:
            raise ValueError(f"window: must be > 0, not {window!r}")
        self.ratio, self.per_second, self.window = ratio, per_second, window
        self._clock = clock
        self._lock = threading.Lock()
        self._events: Deque[Tuple[float, bool]] = collections.deque()  # (time, is_retry)
        self._calls = 0
        self._retries = 0

    def _age(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window:
            _, retry = self._events.popleft()
            if retry:
                self._retries -= 1
            else:
                self._calls -= 1

    def record_call(self) -> None:
        """A first attempt was made."""
        with self._lock:
            now = self._clock()
            self._age(now)
            self._events.append((now, False))
            self._calls += 1

    def try_retry(self) -> bool:
        """Spends one retry if it fits; False: make no retry."""
        with self._lock:
            now = self._clock()
            self._age(now)
            if self._retries + 1 > self.ratio * self._calls + self.per_second * self.window:
                return False
            self._events.append((now, True))
            self._retries += 1
            return True


def run(client, policy: str, fn: Callable[[str], object], *,
        classify: Optional[Callable[[object], str]], retries: int, budget: RetryBudget, ttl,
        key: str):
    """Client.cascade's body (see there)."""
    from .errors import Refused

    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries: must be a whole number >= 0, not {retries!r}")
    budget.record_call()
    tried = []
    failure = None  # (result, exception) of the last failed attempt
    while True:
        try:
            lease = client.admit(policy, key=key, ttl=ttl, exclude=tried)
        except Refused:
            if failure is None:
                raise
            break  # no node left for the retry: the caller gets the failure it has
        started = time.monotonic()
        result, error = None, None
        try:
            result = fn(lease.chosen)
        except BaseException as exc:  # noqa: BLE001 - reported, then re-raised
            error = exc
            outcome = outcome_for_exception(exc)
        else:
            outcome = classify(result) if classify is not None else "success"
            if outcome not in CASCADE_OUTCOMES:
                client.release(lease, "ignored", rtt=time.monotonic() - started)
                raise ValueError(f"classify: must return one of {', '.join(CASCADE_OUTCOMES)}, "
                                 f"not {outcome!r} (the lease was released as 'ignored')")
        client.release(lease, outcome, rtt=time.monotonic() - started)
        if outcome in ("success", "ignored"):
            if error is not None:
                raise error
            return result
        failure = (result, error)
        if len(tried) >= retries or not budget.try_retry():
            break
        tried.append(lease.chosen)
    result, error = failure
    if error is not None:
        raise error
    return result
