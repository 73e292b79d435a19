"""The synchronous gRPC client for ``sluice serve``."""

from __future__ import annotations

import contextlib
import datetime
import math
import threading
import time
from typing import (Callable, Iterable, Iterator, Mapping, Optional, Sequence, Tuple, TypeVar,
                    Union)

import grpc
from google.protobuf import duration_pb2

from .cascade import RetryBudget
from .errors import Refused, SluiceError, Unavailable, from_rpc_error
from .types import OUTCOMES, Charge, CheckManyResult, Decision, Lease, Policies, PolicyState

try:
    from sluice.v1 import sluice_pb2, sluice_pb2_grpc
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sluice_client needs the generated stubs 'sluice.v1.sluice_pb2' and 'sluice_pb2_grpc' on "
        "sys.path (they are generated at build time, never committed). Generate them with\n"
        "  protoc -I proto --python_out=OUT --pyi_out=OUT --grpc_python_out=OUT "
        "--plugin=protoc-gen-grpc_python=$(which grpc_python_plugin) proto/sluice/v1/sluice.proto\n"
        "and put OUT on PYTHONPATH (see clients/python/README.md)."
    ) from exc

__all__ = ["Client", "Seconds"]

Seconds = Union[float, int, datetime.timedelta]
T = TypeVar("T")

# The server encodes "never" (a request that can never pass) as the largest Duration.
_NEVER_SECONDS = 315_576_000_000

_OUTCOME_ENUM = {
    "success": sluice_pb2.OUTCOME_SUCCESS,
    "dropped": sluice_pb2.OUTCOME_DROPPED,
    "ignored": sluice_pb2.OUTCOME_IGNORED,
    "failed": sluice_pb2.OUTCOME_FAILED,
    "timeout": sluice_pb2.OUTCOME_TIMEOUT,
    "overload": sluice_pb2.OUTCOME_OVERLOAD,
}


def _seconds(d) -> float:
    return d.seconds + d.nanos / 1e9


def _seconds_or_never(d) -> Optional[float]:
    return None if d.seconds >= _NEVER_SECONDS else _seconds(d)


def _duration(value: Seconds, name: str):
    """A Duration message for `value` (seconds or a timedelta). The server checks the range."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: must be seconds (int, float) or a timedelta, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be a finite number of seconds, not {value!r}")
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(value * 1e9)))
    return d


def _refused(r, waited: float) -> Refused:
    return Refused(
        r.status, title=r.title, type=r.type, detail=r.detail,
        retry_after=_seconds_or_never(r.retry_after), policy=r.policy, level=r.level,
        current=r.current, limit=r.limit, problem_json=r.problem_json, waited=waited)


def _decision(d) -> Decision:
    return Decision(
        allowed=d.allowed,
        limit=d.limit,
        remaining=d.remaining,
        reset_after=_seconds(d.reset_after),
        retry_after=(_seconds_or_never(d.retry_after) if not d.allowed or d.would_deny
                     else 0.0),
        reason=d.reason,
        detail=d.detail,
        would_deny=d.would_deny,
    )


def _charge(c) -> Charge:
    return Charge(limit=c.limit, remaining=c.remaining, overdraft=c.overdraft, pending=c.pending,
                  reset_after=_seconds(c.reset_after), retry_after=_seconds(c.retry_after))


def _check_request(policy: str, key: str, hits: int):
    if isinstance(hits, bool) or not isinstance(hits, int):
        raise TypeError(f"hits: must be an int, not {hits!r}")
    # hits is always sent (the field is optional on the wire): 0 must reach the server as 0.
    return sluice_pb2.CheckRequest(policy=policy, key=key, hits=hits)


def _outcome_for(exc: Optional[BaseException]) -> str:
    """The outcome a lease block reports: success, or dropped after a timeout, else ignored."""
    if exc is None:
        return "success"
    if isinstance(exc, TimeoutError):
        return "dropped"
    return "ignored"


class Client:
    """A client of one sluice server's gRPC API.

    ``Client(target="127.0.0.1:7070", timeout=5.0)`` opens an insecure channel (or a secure
    one with ``credentials``); every call has a deadline of ``timeout`` seconds. Use it as a
    context manager, or call :meth:`close`. A client is safe to share between threads.

    Errors: a failed call raises a :class:`~sluice_client.SluiceError` subclass
    (:class:`~sluice_client.InvalidArgument`, :class:`~sluice_client.NotFound`, ...). A
    refused admission raises :class:`~sluice_client.Refused`. A denied check is a
    :class:`~sluice_client.Decision` with ``allowed=False``, not an exception.
    """

    def __init__(self, target: str = "127.0.0.1:7070", timeout: float = 5.0, *,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 options: Sequence[Tuple[str, object]] = ()):
        self.target = target
        self.timeout = timeout
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=list(options))
        else:
            self._channel = grpc.secure_channel(target, credentials, options=list(options))
        self._stub = sluice_pb2_grpc.SluiceStub(self._channel)
        self._throttler = sluice_pb2_grpc.ThrottlerStub(self._channel)
        self._budget_lock = threading.Lock()
        self._retry_budget: Optional[RetryBudget] = None

    # ---- lifecycle ----

    def close(self) -> None:
        """Closes the channel. Calls after this fail."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Blocks until the channel is connected; raises Unavailable after `timeout` seconds."""
        try:
            grpc.channel_ready_future(self._channel).result(
                timeout=self.timeout if timeout is None else timeout)
        except grpc.FutureTimeoutError:
            raise Unavailable(f"{self.target}: not reachable") from None

    def _call(self, method, request, timeout: Optional[float] = None):
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    # ---- rate policies ----

    def check(self, policy: str, key: str, hits: int = 1) -> Decision:
        """Spends `hits` for `key` on rate policy `policy` if all of them are allowed now.

        A denial spends nothing and is returned (``allowed=False``), not raised.
        """
        return _decision(self._call(self._stub.Check, _check_request(policy, key, hits)).decision)

    def peek(self, policy: str, key: str, hits: int = 1) -> Decision:
        """The decision :meth:`check` would give now, spending nothing."""
        return _decision(self._call(self._stub.Peek, _check_request(policy, key, hits)).decision)

    def charge(self, policy: str, key: str, hits: int) -> Charge:
        """Charges `hits` to `key` after the fact (a cost known once the call is over), on a
        rate or federated policy: counted whatever the key has left, so a charge may take it
        past its limit, and its later checks are refused until that is waited out. Negative
        `hits` give back what a check took beyond the call's cost. Returns the key's
        allowance after it; never refused (an error means nothing was recorded).
        """
        if isinstance(hits, bool) or not isinstance(hits, int):
            raise TypeError(f"hits: must be an int, not {hits!r}")
        req = sluice_pb2.ChargeRequest(policy=policy, key=key, hits=hits)
        return _charge(self._call(self._stub.Charge, req))

    def check_many(self, checks: Iterable[Sequence]) -> CheckManyResult:
        """Several checks, all or nothing: ``[(policy, key), (policy, key, hits), ...]``.

        If any is denied, none is debited. Returns ``(allowed, decisions, denied_index)``.
        """
        req = sluice_pb2.CheckManyRequest()
        for c in checks:
            if len(c) not in (2, 3):
                raise ValueError(f"checks: each must be (policy, key) or (policy, key, hits), "
                                 f"not {c!r}")
            req.checks.append(_check_request(c[0], c[1], c[2] if len(c) == 3 else 1))
        resp = self._call(self._stub.CheckMany, req)
        return CheckManyResult(
            allowed=resp.allowed,
            decisions=[_decision(d) for d in resp.decisions],
            denied_index=None if resp.allowed else resp.denied_index,
        )

    # ---- concurrency policies ----

    def admit(self, policy: str, key: str = "", tenant: str = "", upstream: str = "",
              route: str = "", ttl: Optional[Seconds] = None,
              exclude: Sequence[str] = (), max_wait: Optional[Seconds] = None,
              attributes: Optional[Mapping[str, Union[str, Sequence[str]]]] = None) -> Lease:
        """Admits one call on an adaptive, fleet, concurrency or cascade policy and returns its
        lease.

        `key` keys a chained rate policy (a concurrency policy falls back to `tenant`);
        `tenant`, `upstream` and `route` address a concurrency policy's limits. `ttl`: the
        lease's lifetime without a heartbeat (``None``: the server's ``lease_ttl``). A cascade
        policy names the node it chose in ``lease.chosen`` and never chooses a node in
        `exclude` (those a retry already tried).

        A concurrency policy whose upstream has a ``queue`` keeps a call that finds it full
        waiting in the queue until a slot is handed to it, up to the queue's timeout and at most
        `max_wait` seconds (``None``: the queue's timeout; ``0``: do not wait); the call's gRPC
        deadline is then the client's timeout plus `max_wait`. ``lease.waited`` (and
        ``Refused.waited``) says how long it waited.

        `attributes`: what else the policy's kind reads, by name (a list of strings for a list);
        `tenant`, `upstream`, `route` and `exclude` are shorthands for attributes of those
        names. What the kind answers beyond the lease is in ``lease.attributes``.

        Raises :class:`~sluice_client.Refused` (status 429 or 503) when not admitted.
        """
        if isinstance(exclude, str):
            raise TypeError("exclude: must be a list of node names, not a string")
        req = sluice_pb2.AdmitRequest(policy=policy, key=key, tenant=tenant, upstream=upstream,
                                      route=route, exclude=list(exclude))
        for name, value in (attributes or {}).items():
            for v in ([value] if isinstance(value, str) else list(value)):
                if not isinstance(v, str):
                    raise TypeError(f"attributes: {name!r} must be a string or a list of "
                                    f"strings, not {value!r}")
                req.attributes.add(name=name, value=v)
        if ttl is not None:
            req.ttl.CopyFrom(_duration(ttl, "ttl"))
        timeout = None
        if max_wait is not None:
            req.max_wait.CopyFrom(_duration(max_wait, "max_wait"))
            timeout = self.timeout + float(max_wait)
        resp = self._call(self._stub.Admit, req, timeout)
        waited = _seconds(resp.waited) if resp.HasField("waited") else 0.0
        if resp.admitted:
            answered = time.monotonic()
            deadline = (answered + _seconds(resp.call_deadline)
                        if resp.HasField("call_deadline") else None)
            answer: dict = {}
            for a in resp.attributes:
                if a.name not in answer:
                    answer[a.name] = a.value
                elif isinstance(answer[a.name], list):
                    answer[a.name].append(a.value)
                else:
                    answer[a.name] = [answer[a.name], a.value]
            return Lease(lease_id=resp.lease_id, ttl=_seconds(resp.ttl), policy=policy,
                         admitted_at=answered, chosen=resp.chosen, deadline=deadline,
                         waited=waited, attributes=answer, would_deny=resp.would_deny,
                         rejection=_refused(resp.rejection, waited) if resp.would_deny else None,
                         reusable=resp.reusable)
        raise _refused(resp.rejection, waited)

    def release(self, lease: Union[Lease, str], outcome: str = "success",
                rtt: Optional[Seconds] = None, cost: Optional[int] = None) -> float:
        """Ends a lease and frees its slot; returns how long it was held (seconds).

        `outcome`: ``"success"`` (the call completed; `rtt` is latency evidence),
        ``"dropped"`` (timed out / overloaded: the limit should come down; ``"timeout"`` and
        ``"overload"`` say which, and mean the same to a limit), ``"ignored"`` (says nothing
        about the backend) or ``"failed"`` (failed, not from overload: no latency evidence, but
        a health signal). `rtt`: the call's latency; ``None``: the time the
        lease was held. `cost`: what the call cost its policy's chained rate policy, in hits
        (the admit took one for its key; the rest is charged now, as :meth:`charge` does);
        with a :class:`Lease`, ``lease.charged`` is then the key's :class:`Charge`. Raises
        :class:`~sluice_client.NotFound` when the lease is unknown, already released or
        expired.
        """
        if outcome not in _OUTCOME_ENUM:
            raise ValueError(f"outcome: must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        lease_id = lease.lease_id if isinstance(lease, Lease) else lease
        req = sluice_pb2.ReleaseRequest(lease_id=lease_id, outcome=_OUTCOME_ENUM[outcome])
        if rtt is not None:
            req.rtt.CopyFrom(_duration(rtt, "rtt"))
        if cost is not None:
            if isinstance(cost, bool) or not isinstance(cost, int):
                raise TypeError(f"cost: must be an int, not {cost!r}")
            req.cost = cost
        resp = self._call(self._stub.Release, req)
        if isinstance(lease, Lease):
            lease.released = True
            if resp.HasField("charged"):
                lease.charged = _charge(resp.charged)
        return _seconds(resp.held)

    def keep(self, lease: Union[Lease, str], outcome: str = "success",
             rtt: Optional[Seconds] = None,
             earlier: Sequence[Tuple[str, Seconds]] = ()) -> bool:
        """Reports a call a reusable lease (``lease.reusable``) carried and keeps its permit for
        the holder's next call, started now (a ``Release`` with ``keep``; the TTL restarts).
        `outcome` and `rtt` as :meth:`release`'s; `earlier`: the calls it carried before this
        one since it was last kept, oldest first, as ``(outcome, rtt)`` pairs. Returns whether
        that next call is within the policy's limit: ``False`` when the limit came down below
        the calls in flight (release the lease once the call ends, and start none on it).
        Raises :class:`~sluice_client.FailedPrecondition` for a lease that is not reusable
        (released all the same), :class:`~sluice_client.NotFound` as :meth:`release` does.
        """
        named = [("outcome", outcome)] + [(f"earlier[{i}].outcome", o)
                                          for i, (o, _) in enumerate(earlier)]
        for field_name, word in named:
            if word not in _OUTCOME_ENUM:
                raise ValueError(f"{field_name}: must be one of {', '.join(OUTCOMES)}, "
                                 f"not {word!r}")
        lease_id = lease.lease_id if isinstance(lease, Lease) else lease
        req = sluice_pb2.ReleaseRequest(lease_id=lease_id, outcome=_OUTCOME_ENUM[outcome],
                                        keep=True)
        if rtt is not None:
            req.rtt.CopyFrom(_duration(rtt, "rtt"))
        for i, (o, r) in enumerate(earlier):
            e = req.earlier.add(outcome=_OUTCOME_ENUM[o])
            e.rtt.CopyFrom(_duration(r, f"earlier[{i}].rtt"))
        return self._call(self._stub.Release, req).kept

    def heartbeat(self, lease: Union[Lease, str], ttl: Optional[Seconds] = None) -> float:
        """Extends a live lease to `ttl` from now (``None``: its current TTL); returns the TTL.

        Raises :class:`~sluice_client.NotFound` when the lease already expired.
        """
        lease_id = lease.lease_id if isinstance(lease, Lease) else lease
        req = sluice_pb2.HeartbeatRequest(lease_id=lease_id)
        if ttl is not None:
            req.ttl.CopyFrom(_duration(ttl, "ttl"))
        applied = _seconds(self._call(self._stub.Heartbeat, req).ttl)
        if isinstance(lease, Lease):
            lease.ttl = applied
        return applied

    @contextlib.contextmanager
    def lease(self, policy: str, key: str = "", tenant: str = "", upstream: str = "",
              route: str = "", ttl: Optional[Seconds] = None,
              max_wait: Optional[Seconds] = None,
              attributes: Optional[Mapping[str, Union[str, Sequence[str]]]] = None
              ) -> Iterator[Lease]:
        """Admits on entry (raising :class:`~sluice_client.Refused` if not admitted) and
        releases on exit, with the time since admission as the RTT::

            with client.lease("search", key=user) as lease:
                call_the_backend()

        The outcome reported at release:

        * the block finished: ``"success"``;
        * it raised a :class:`TimeoutError` (socket timeouts, ``asyncio.TimeoutError``,
          :class:`~sluice_client.DeadlineExceeded`...): ``"dropped"`` -- the backend is slow,
          the limit should come down;
        * it raised anything else (including ``KeyboardInterrupt``): ``"ignored"`` -- the
          failure says nothing about the backend's latency.

        Set ``lease.outcome`` inside the block to override (e.g. ``"dropped"`` on an HTTP 503
        from the backend), and ``lease.cost`` to charge what the call cost its chained rate
        policy. A lease released inside the block is not released again.

        If the block raised, an error while releasing is swallowed and the block's exception
        propagates (the lease then expires on the server after its TTL). If the block finished,
        a failed release raises (e.g. :class:`~sluice_client.NotFound` when the lease expired
        because the block outlived its TTL without a heartbeat).
        """
        lease = self.admit(policy, key=key, tenant=tenant, upstream=upstream, route=route,
                           ttl=ttl, max_wait=max_wait, attributes=attributes)
        try:
            yield lease
        except BaseException as exc:
            if not lease.released:
                with contextlib.suppress(SluiceError, ValueError):
                    self._release_at_end(lease, _outcome_for(exc))
            raise
        if not lease.released:
            self._release_at_end(lease, "success")

    def _release_at_end(self, lease: Lease, fallback: str) -> None:
        """Releases a lease() block's lease with its outcome. An outcome the block set that is
        not one of OUTCOMES still frees the slot (as "ignored"); then ValueError names it."""
        chosen = lease.outcome or fallback
        valid = chosen in _OUTCOME_ENUM
        extra = {} if lease.cost is None else {"cost": lease.cost}
        self.release(lease, chosen if valid else "ignored",
                     rtt=time.monotonic() - lease.admitted_at, **extra)
        if not valid:
            raise ValueError(f"lease.outcome: must be one of {', '.join(OUTCOMES)}, "
                             f"not {chosen!r} (the lease was released as 'ignored')")

    # ---- cascade policies ----

    def cascade(self, policy: str, fn: Callable[[str], T], *,
                classify: Optional[Callable[[T], str]] = None, retries: int = 0,
                budget: Optional[RetryBudget] = None, ttl: Optional[Seconds] = None,
                key: str = "") -> T:
        """Picks a node of a ``cascade`` policy, calls ``fn(node)``, reports how it went and
        returns what `fn` returned::

            reply = client.cascade("replicas", lambda node: get(node, "/item/7"),
                                   classify=lambda r: outcome_of_http(r.status))

        The outcome reported: ``classify(result)`` (one of ``CASCADE_OUTCOMES``; without it,
        ``"success"``), or, when `fn` raises, :func:`~sluice_client.outcome_for_exception` of
        the exception (a TimeoutError is ``"timeout"``, an exception carrying HTTP 429/503 or
        gRPC RESOURCE_EXHAUSTED/UNAVAILABLE ``"overload"``), which is then re-raised.

        `retries`: how many times a failed call is retried on another node (never one already
        tried); 0 by default. A retry is made only while `budget` (the client's own
        :class:`~sluice_client.RetryBudget` by default: 10% of calls plus 10 a second) allows,
        so retries cannot multiply the load during an outage; when no retry is made, the last
        failure is returned (or raised). Raises :class:`~sluice_client.Refused` when no node
        has room for the first attempt.
        """
        from . import cascade as _cascade

        if budget is None:
            with self._budget_lock:
                if self._retry_budget is None:
                    self._retry_budget = _cascade.RetryBudget()
                budget = self._retry_budget
        return _cascade.run(self, policy, fn, classify=classify, retries=retries, budget=budget,
                            ttl=ttl, key=key)

    # ---- the throttler ----

    def throttler_check(self, app: str = "", *, shard: str = "", scope: str = "",
                        low_priority: bool = False, threshold: float = 0.0):
        """One throttler check over gRPC (sluice.v1.Throttler/Check), as GET /throttler/check
        answers it: a :class:`sluice_client.throttler.CheckResult` (``ok`` for status 200; 429
        over a threshold or failing closed, 417 the app is throttled). ``threshold`` > 0 is this
        check's own for every metric. NOT_FOUND (no throttler serves ``shard``) and
        INVALID_ARGUMENT raise."""
        from .throttler import CheckResult  # the HTTP helper's result, one shape for both

        req = sluice_pb2.ThrottlerCheckRequest(app=app, shard=shard, scope=scope,
                                               low_priority=low_priority, threshold=threshold)
        resp = self._call(self._throttler.Check, req)
        return CheckResult(ok=resp.status_code == 200, status=resp.status_code,
                           reason=resp.reason, value=resp.value, threshold=resp.threshold,
                           metric=resp.metric or None, message=resp.message)

    # ---- state ----

    def policies(self) -> Policies:
        """Every policy's state, the number of leases held and the config generation."""
        resp = self._call(self._stub.ListPolicies, sluice_pb2.ListPoliciesRequest())
        return Policies(
            by_name={
                p.name: PolicyState._from_json(p.name, p.kind, p.rate, p.in_flight, p.limit,
                                               p.state_json)
                for p in resp.policies
            },
            leases=resp.leases,
            config_generation=resp.config_generation,
        )

