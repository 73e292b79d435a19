"""Admission for every request a server handles: what the ASGI middleware
(:mod:`sluice_client.asgi`), the WSGI middleware (:mod:`sluice_client.wsgi`) and the gRPC server
interceptor (:mod:`sluice_client.grpc_interceptor`) share.

Each request is admitted on one policy of ``sluice serve`` before the application sees it:

* a **rate** policy (``kind: rate``, or a federated one): one ``Check`` of ``hits`` for the
  request's key (with ``allowance=N``, one of N hits per N requests, the rest admitted here:
  :mod:`sluice_client.allowance`). Denied: HTTP 429 (gRPC ``RESOURCE_EXHAUSTED``).
* a **concurrency** policy (``adaptive``, ``fleet``, ``concurrency``, ``cascade``): ``Admit``
  before, ``Release`` after, with the request's outcome and latency. Refused: the server's
  status, 503 for a limit (gRPC ``UNAVAILABLE``) or 429 when the policy's chained rate policy
  refused (gRPC ``RESOURCE_EXHAUSTED``).

``kind="auto"`` (the default) learns which from the server: it checks first, and a policy that
answers ``FAILED_PRECONDITION`` (a concurrency policy) is admitted from then on.

A refusal carries ``Retry-After`` (whole seconds, rounded up; absent when the request can never
pass) and an RFC 9457 ``application/problem+json`` body: the server's own document for an
``Admit`` refusal, one of the same shape (``type urn:sluice:problem:rate-limit-exceeded``) for a
denied check. Over gRPC the problem's title and detail are the status message, and the trailing
metadata carries ``retry-after`` (seconds), ``grpc-retry-pushback-ms`` (gRPC's own retry
pushback) and ``sluice-problem`` (the JSON document).

The outcome a lease is released with (what an adaptive limit learns from):

=============================================  ==========================================
the request                                    outcome
=============================================  ==========================================
answered 1xx-4xx (but 408, 429)                ``success`` (its latency is evidence)
answered 429 or 503 (the app shed it)          ``overload`` (a drop: the limit comes down)
answered 408 or 504, or raised a TimeoutError  ``timeout`` (a drop: the limit comes down)
answered any other 5xx, or raised              ``failed`` (no latency evidence)
cancelled (the client went away)               ``ignored``
=============================================  ==========================================

and for gRPC, by status code: ``OK`` and the caller's errors success; ``RESOURCE_EXHAUSTED``
and ``UNAVAILABLE`` overload; ``DEADLINE_EXCEEDED`` (or the client's deadline passed) timeout;
``CANCELLED`` ignored; ``UNKNOWN``, ``INTERNAL``, ``UNIMPLEMENTED``, ``DATA_LOSS`` failed
(:func:`~sluice_client.outcome_of_http`, :func:`~sluice_client.outcome_of_grpc`). The
application may choose instead: ``current_admission().outcome = "dropped"``.

A request whose own values the server rejects (an empty key, an unknown tenant: an
``INVALID_ARGUMENT`` or ``NOT_FOUND`` naming a field other than ``policy``) is refused with 400
(gRPC ``INVALID_ARGUMENT``), whatever the failure mode: a client must not get past admission by
leaving a header out.

With ``lease_reuse=seconds`` on an adaptive policy (whose leases are reusable), a finished
request's lease waits that long for the next request of the same key, which then goes through
without an ``Admit``. Exact all the same: a lease carries one request at a time and holds its
permit until released. Nothing is sent on a request's path: the gate's thread, once per
``lease_reuse``, reports a kept lease's requests (outcome and latency, for the server's adaptive
limit) in a ``Release`` with ``keep`` (the earlier ones in ``earlier``) while the lease carries
a request, and releases the leases that waited ``lease_reuse`` without one. What it costs: a
waiting lease counts as in flight at the server for up to twice ``lease_reuse``; the limit hears
of the requests late (typically within twice ``lease_reuse``; at the latest every 256 requests,
or at the release); a limit lowered below the calls in flight reaches a kept lease when the
server answers its next keep. :meth:`Gate.close` (or ``aclose``) releases the waiting leases.

When the sluice server cannot be asked (unreachable, no answer within ``timeout``, or any other
error, an unknown policy included), ``fail_open=True`` (the default) lets the request through
unchecked, and ``fail_open=False`` refuses it with 503 and ``Retry-After: unreachable_retry``.
After a failure to reach it, the server is not asked again for ``unreachable_retry`` seconds (1
s): the failure mode applies at once instead of every request waiting for its own timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence, Tuple, Union

import grpc

from .allowance import Allowances
from .cascade import outcome_for_exception, outcome_of_grpc, outcome_of_http
from .client import (_NEVER_SECONDS, _OUTCOME_ENUM, Client, _check_request, _decision,
                     _duration, _seconds, sluice_pb2, sluice_pb2_grpc)
from .errors import FailedPrecondition, SluiceError, from_rpc_error
from .types import OUTCOMES, Decision, Lease

__all__ = ["RequestInfo", "Admission", "Refusal", "Gate", "header", "route_key",
           "current_admission", "KINDS"]

log = logging.getLogger("sluice_client.adapters")

KINDS = ("auto", "rate", "concurrency")

# The admission of the request being handled (set around the application's call).
_current: contextvars.ContextVar[Optional["Admission"]] = contextvars.ContextVar(
    "sluice_admission", default=None)


def current_admission() -> Optional["Admission"]:
    """The :class:`Admission` of the request this code is handling (inside a middleware's or
    the interceptor's call of the application), or ``None``. Set ``.outcome`` on it to choose
    the outcome its lease is released with, or ``.cost`` to charge the chained rate policy."""
    return _current.get()


class RequestInfo:
    """What a key function sees of a request, the same for every adapter.

    Attributes:
        method: the HTTP method (``""`` for gRPC).
        path: the HTTP path (without the query string), or the gRPC method's full name
            (``/package.Service/Method``).
        route: ``"GET /items/7"`` for HTTP, the full method name for gRPC: the default key.
        raw: the ASGI scope, the WSGI environ, or the gRPC call's details (its ``method`` and
            ``invocation_metadata``, as a ``grpc.HandlerCallDetails`` has them).
    """

    __slots__ = ("method", "path", "route", "raw")

    def __init__(self, method: str, path: str, raw: Any, route: Optional[str] = None):
        self.method = method
        self.path = path
        self.route = route if route is not None else f"{method} {path}"
        self.raw = raw

    def header(self, name: str) -> Optional[str]:
        """The request's header (gRPC: metadata) `name`, case-insensitive; ``None``: absent."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.route}>"


def header(name: str, default: Optional[str] = None) -> Callable[[RequestInfo], Optional[str]]:
    """A key function: the value of header (gRPC: metadata key) `name`, else `default` (else
    the gate keys the request by its route)."""
    lowered = name.lower()

    def key(request: RequestInfo) -> Optional[str]:
        value = request.header(lowered)
        return value if value else default

    key.__name__ = f"header({name!r})"
    return key


def route_key(request: RequestInfo) -> str:
    """The default key function: ``"GET /items/7"`` (HTTP) or ``/pkg.Service/Method`` (gRPC)."""
    return request.route


@dataclass(frozen=True)
class Refusal:
    """Why a request is not let through, and how to say so.

    Attributes:
        status: 429 (a rate policy, or a concurrency policy's chained rate policy), 503 (a
            concurrency limit; the sluice server could not be asked, with ``fail_open=False``)
            or 400 (the server rejected what the request gave: an empty or unknown tenant...).
        retry_after: seconds until trying again makes sense; ``None``: never (more hits than
            the policy allows at once).
        problem: the RFC 9457 problem document.
    """

    status: int
    retry_after: Optional[float]
    problem: Dict[str, Any]

    @property
    def retry_after_header(self) -> Optional[str]:
        """``Retry-After``'s value: whole seconds, rounded up; ``None``: no header."""
        if self.retry_after is None:
            return None
        return str(max(0, math.ceil(self.retry_after - 1e-9)))

    def http_status_line(self) -> str:
        return {400: "400 Bad Request", 429: "429 Too Many Requests",
                503: "503 Service Unavailable"}.get(self.status, f"{self.status} Refused")

    def http_headers(self, body: bytes) -> List[Tuple[str, str]]:
        headers = [("Content-Type", "application/problem+json"),
                   ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
        if self.retry_after_header is not None:
            headers.append(("Retry-After", self.retry_after_header))
        return headers

    def body(self) -> bytes:
        return json.dumps(self.problem, separators=(",", ":")).encode()

    @property
    def grpc_code(self) -> grpc.StatusCode:
        if self.status == 429:
            return grpc.StatusCode.RESOURCE_EXHAUSTED
        if self.status == 400:
            return grpc.StatusCode.INVALID_ARGUMENT
        return grpc.StatusCode.UNAVAILABLE

    def grpc_message(self) -> str:
        title = self.problem.get("title") or ("Rate Limit Exceeded" if self.status == 429
                                              else "Service Unavailable")
        detail = self.problem.get("detail")
        return f"{title}: {detail}" if detail else str(title)

    def grpc_trailers(self) -> List[Tuple[str, str]]:
        out = []
        if self.retry_after_header is not None:
            out.append(("retry-after", self.retry_after_header))
            out.append(("grpc-retry-pushback-ms", str(max(0, math.ceil(self.retry_after * 1000)))))
        out.append(("sluice-problem", json.dumps(self.problem, separators=(",", ":"),
                                                 ensure_ascii=True)))
        return out


def _never(d) -> Optional[float]:
    return None if d.seconds >= _NEVER_SECONDS else _seconds(d)


def _rejection_refusal(r) -> Refusal:
    retry_after = _never(r.retry_after) if r.HasField("retry_after") else None
    try:
        problem = json.loads(r.problem_json) if r.problem_json else {}
    except ValueError:
        problem = {}
    if not isinstance(problem, dict) or not problem:
        problem = {"type": r.type or "about:blank", "title": r.title, "status": r.status,
                   "detail": r.detail, "policy": r.policy}
    return Refusal(int(r.status) or 503, retry_after, problem)


def _decision_refusal(policy: str, d: Decision) -> Refusal:
    # The key is not repeated in the detail: it may be a credential (an API key).
    if d.reason:
        detail = f"Rate policy {policy} refused this key: {d.reason}"
        if d.detail:
            detail += f" ({d.detail})"
    else:
        detail = f"Rate policy {policy}: no allowance left for this key (limit {d.limit})"
    if d.retry_after is not None:
        detail += f"; retry after {round(d.retry_after, 3):g}s"
    problem: Dict[str, Any] = {
        "type": "urn:sluice:problem:rate-limit-exceeded",
        "title": "Rate Limit Exceeded",
        "status": 429,
        "detail": detail,
        "limit_type": "rate",
        "policy": policy,
        "limit": d.limit,
        "remaining": d.remaining,
    }
    if d.reason:
        problem["reason"] = d.reason
    if d.retry_after is not None:
        problem["retry_after_seconds"] = max(0, math.ceil(d.retry_after - 1e-9))
    return Refusal(429, d.retry_after, problem)


def _request_at_fault(err: SluiceError) -> bool:
    """The server rejected what the request gave (its key, tenant, upstream, ...), not the
    policy: a malformed or unknown value, not something the failure mode may let through."""
    return (err.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
            and bool(err.field) and err.field != "policy")


def _bad_request_refusal(err: SluiceError) -> Refusal:
    return Refusal(400, None, {
        "type": "urn:sluice:problem:admission-bad-request",
        "title": "Bad Request",
        "status": 400,
        "detail": err.message,
        "field": err.field,
    })


def _unavailable_refusal(retry_after: float) -> Refusal:
    return Refusal(503, retry_after, {
        "type": "urn:sluice:problem:admission-unavailable",
        "title": "Admission Control Unavailable",
        "status": 503,
        "detail": "the admission-control server could not be asked; refused (fail closed)",
        "retry_after_seconds": max(0, math.ceil(retry_after - 1e-9)),
    })


@dataclass
class Admission:
    """One request's admission.

    Attributes:
        policy: the policy asked.
        request: the :class:`RequestInfo`.
        key: the key it was admitted under.
        decision: a rate policy's :class:`~sluice_client.Decision`; ``None`` otherwise.
        lease: a concurrency policy's :class:`~sluice_client.Lease`; ``None`` otherwise.
        refusal: set when the request is refused (it is then not passed on).
        error: the :class:`~sluice_client.SluiceError` when the sluice server could not be asked
            (``None`` too when it was skipped, see ``unchecked``).
        unchecked: let through without an answer (``fail_open`` while the server was unreachable).
        outcome: set it (one of ``sluice_client.OUTCOMES``) to choose the outcome the lease is
            released with; ``None``: from the response.
        cost: set it to charge the chained rate policy that many hits at the release.
        released_outcome: the outcome the lease was released with (after the release).
        rtt: the latency reported with it: seconds from the admission to the end of the
            response (after the release).
        reused: admitted on a lease a finished request left (``lease_reuse``), without an Admit.
    """

    policy: str
    request: Optional[RequestInfo] = None
    key: str = ""
    decision: Optional[Decision] = None
    lease: Optional[Lease] = None
    refusal: Optional[Refusal] = None
    error: Optional[SluiceError] = None
    unchecked: bool = False
    outcome: Optional[str] = None
    cost: Optional[int] = None
    released_outcome: Optional[str] = None
    rtt: Optional[float] = None
    started: float = field(default_factory=time.monotonic)
    reused: bool = False
    kept: Optional["_Kept"] = None


    @property
    def admitted(self) -> bool:
        return self.refusal is None


class _Kept:
    """A reusable lease the gate keeps between requests of one key (``lease_reuse``)."""

    __slots__ = ("lease", "key", "ended", "since", "reported", "retired", "waiting")

    def __init__(self, lease: Lease, key: str, now: float):
        self.lease = lease
        self.key = key
        self.ended: List[Tuple[str, float]] = []  # requests carried, not reported yet
        self.since = now      # waiting since
        self.reported = now   # its last Release with keep (or its Admit)
        self.retired = False  # the server said it is over its limit, or a keep failed
        self.waiting = False  # in the gate's pool


# Requests a kept lease carries before they are reported, whatever the time (then the request
# that ends the last of them sends the keep itself; the server takes at most 1024).
_MAX_UNREPORTED = 256


# An operation the gate asks its driver to perform: (rpc name, request message, background,
# deadline in seconds). A background operation is not waited for; its failure is logged.
Op = Tuple[str, Any, bool, float]
Flow = Generator[Op, Any, Any]

StrOrFn = Union[str, Callable[[RequestInfo], Optional[str]]]


def _hits_held(hits: Any) -> bool:
    """Whether `hits` can be taken from an allowance (else the server's error is the answer)."""
    return isinstance(hits, int) and not isinstance(hits, bool) and hits >= 1


def _value(spec: Optional[StrOrFn], request: RequestInfo) -> str:
    if spec is None:
        return ""
    if callable(spec):
        return spec(request) or ""
    return spec


class Gate:
    """The admission logic, whatever the transport: :meth:`enter` before the application, and
    :meth:`exit` after it (synchronous, on a :class:`~sluice_client.Client`), or
    :meth:`enter_async` and :meth:`exit_async` (on a ``grpc.aio`` channel of the loop's own).

    Arguments (the adapters take the same keywords):
        policy: the policy's name.
        client: a :class:`~sluice_client.Client` to use (synchronous adapters); else one is made
            for ``target`` with ``timeout``.
        target: ``host:port`` of the sluice server's gRPC API (default ``127.0.0.1:7070``).
        timeout: seconds to wait for an answer (0.5; the request waits that long at most).
        credentials, options: for the channel made for ``target``.
        kind: ``"rate"``, ``"concurrency"`` or ``"auto"`` (learnt from the server).
        key: a function of the :class:`RequestInfo` giving the key (a falsy result: the route);
            :func:`header` makes one. Default: :func:`route_key`.
        hits: hits a request spends on a rate policy (an int or a function of the request).
        tenant, upstream, route: a concurrency policy's attributes (a string or a function of
            the request).
        ttl: the lease's lifetime (seconds; ``None``: the server's ``lease_ttl``). A request
            that outlives it loses its lease (released as expired by the server).
        max_wait: seconds a request may wait in a concurrency upstream's ``queue`` for a slot
            (0, the default: refused at once when full); the admission's deadline is then
            ``timeout + max_wait``.
        fail_open: let requests through when the server cannot be asked (default ``True``).
        unreachable_retry: seconds before asking an unreachable server again (1.0); also the
            ``Retry-After`` of a fail-closed refusal.
        background_release: release without waiting for the answer (``False``: the release is
            done before the next request on the same connection is read, so a client's
            sequential requests never race their own leases).
        skip: a function of the request: ``True`` lets it through without admission.
        allowance: on a rate policy, hits taken from the server at once and spent here by the
            requests after it, so most are admitted without a round trip (0, the default: every
            request is asked). What it costs is bounded: :mod:`sluice_client.allowance`.
        allowance_hold: seconds a hit taken so may wait to be spent (0.05); then it is dropped.
        lease_reuse: on an adaptive policy, seconds a finished request's lease waits for the
            next request of its key, which then goes without an Admit (0, the default: every
            request is admitted). See the module's notes for what it costs.
    """

    def __init__(self, policy: str, *, client: Optional[Client] = None,
                 target: str = "127.0.0.1:7070", timeout: float = 0.5,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 options: Sequence[Tuple[str, Any]] = (), kind: str = "auto",
                 key: Optional[Callable[[RequestInfo], Optional[str]]] = None,
                 hits: Union[int, Callable[[RequestInfo], int]] = 1,
                 tenant: Optional[StrOrFn] = None, upstream: Optional[StrOrFn] = None,
                 route: Optional[StrOrFn] = None, ttl: Optional[float] = None,
                 max_wait: float = 0.0, fail_open: bool = True, unreachable_retry: float = 1.0,
                 background_release: bool = False,
                 skip: Optional[Callable[[RequestInfo], bool]] = None,
                 allowance: int = 0, allowance_hold: float = 0.05, lease_reuse: float = 0.0):
        if not policy or not isinstance(policy, str):
            raise ValueError(f"policy: must be a policy's name, not {policy!r}")
        if kind not in KINDS:
            raise ValueError(f"kind: must be one of {', '.join(KINDS)}, not {kind!r}")
        if key is not None and not callable(key):
            raise TypeError(f"key: must be a function of the request (e.g. "
                            f"sluice_client.adapters.header('x-api-key')), not {key!r}")
        if max_wait < 0:
            raise ValueError(f"max_wait: must be >= 0, not {max_wait!r}")
        if unreachable_retry < 0:
            raise ValueError(f"unreachable_retry: must be >= 0, not {unreachable_retry!r}")
        if kind == "concurrency" and allowance:
            raise ValueError("allowance: only a rate policy's hits can be taken ahead "
                             "(kind is 'concurrency')")
        if not lease_reuse >= 0:
            raise ValueError(f"lease_reuse: must be >= 0, not {lease_reuse!r}")
        if kind == "rate" and lease_reuse:
            raise ValueError("lease_reuse: only a concurrency policy's leases can be kept "
                             "(kind is 'rate')")
        self.lease_reuse = float(lease_reuse)
        self.allowances = Allowances(allowance, allowance_hold) if allowance else None
        self.policy = policy
        self.kind = kind
        self._resolved = "concurrency" if kind == "concurrency" else "rate"
        self.key = key or route_key
        self.hits = hits
        self.tenant, self.upstream, self.route = tenant, upstream, route
        self.ttl = ttl
        self.max_wait = float(max_wait)
        self.fail_open = fail_open
        self.unreachable_retry = float(unreachable_retry)
        self.background_release = background_release
        self.skip = skip
        self._own_client = client is None
        self.client = client
        self.target = client.target if client is not None else target
        self.timeout = client.timeout if client is not None else timeout
        self._credentials = credentials
        self._options = list(options)
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._logged_down_until = 0.0
        self._aio: Optional[Tuple[Any, Any, Any]] = None  # (loop, channel, stub)
        self._pending: set = set()
        self._refilling = 0  # the allowance's refills not answered yet (under _lock)
        self._kept: Dict[str, List[_Kept]] = {}  # waiting leases by key (under _lock)
        self._live: set = set()  # every kept lease (under _lock)
        self._kept_cv = threading.Condition(self._lock)
        self._sweeper: Optional[threading.Thread] = None
        self._closing = False
        self.stats: Dict[str, int] = dict.fromkeys(
            ("admitted", "refused", "bad_request", "unchecked", "failed_closed", "released",
             "release_errors", "reused", "keeps"),
            0)

    # ---- the flows, whatever the transport ----

    def _count(self, name: str) -> None:
        with self._lock:
            self.stats[name] += 1

    def _start(self, request: RequestInfo) -> Tuple[Admission, Optional[Flow]]:
        """`request`'s admission, and the flow that asks the server for it; no flow when it
        needs no RPC (an allowance's hits, a kept lease, the server known to be down): the
        common case, answered without a generator's turns."""
        adm = Admission(self.policy, request)
        now = time.monotonic()
        if now < self._down_until:
            return self._failure(adm, None), None
        adm.key = key = self.key(request) or request.route
        hits = self.hits(request) if callable(self.hits) else self.hits
        if self._resolved == "rate":
            a = self.allowances
            if a is not None and _hits_held(hits):
                d, due = a.spend(key, hits, now)
                if d is not None:
                    if due:
                        self._refill(key, due)
                    self._decided(adm, d, now)
                    return adm, None
        elif self.lease_reuse > 0 and self._reuse(adm):
            return adm, None
        return adm, self._ask(adm, request, hits)

    def _decided(self, adm: Admission, d: Decision, now: float) -> None:
        adm.decision = d
        adm.started = now
        if not d.allowed:
            adm.refusal = _decision_refusal(self.policy, d)
        self._count("refused" if adm.refusal else "admitted")

    def _ask(self, adm: Admission, request: RequestInfo, hits: Any) -> Flow:
        kind = self._resolved
        err: Optional[SluiceError] = None
        for _ in range(2):
            try:
                if kind == "rate":
                    d = yield from self._check(adm.key, hits)
                    self._decided(adm, d, time.monotonic())
                    return adm
                if self.lease_reuse > 0 and self._reuse(adm):
                    return adm
                resp = yield ("Admit", self._admit_request(request, adm.key), False,
                              self.timeout + self.max_wait)
                if resp.admitted:
                    adm.lease = Lease(
                        lease_id=resp.lease_id, ttl=_seconds(resp.ttl), policy=self.policy,
                        chosen=resp.chosen, would_deny=resp.would_deny,
                        deadline=(time.monotonic() + _seconds(resp.call_deadline)
                                  if resp.HasField("call_deadline") else None),
                        reusable=resp.reusable)
                    if self.lease_reuse > 0 and resp.reusable:
                        adm.kept = self._kept_new(adm.lease, adm.key)
                else:
                    adm.refusal = _rejection_refusal(resp.rejection)
                adm.started = time.monotonic()
                self._count("refused" if adm.refusal else "admitted")
                return adm
            except FailedPrecondition as e:
                # A check on a concurrency policy, or an admit on a rate policy: with "auto",
                # the policy is of the other family (or was reloaded as one).
                err = e
                if self.kind != "auto":
                    break
                kind = "concurrency" if kind == "rate" else "rate"
                self._resolved = kind
            except SluiceError as e:
                if _request_at_fault(e):
                    adm.error = e
                    adm.refusal = _bad_request_refusal(e)
                    self._count("bad_request")
                    return adm
                err = e
                break
        return self._failure(adm, err)

    def _check(self, key: str, hits: int) -> Flow:
        """A rate policy's decision for `hits` on `key`: from the allowance held here when it
        can, else from the server (a block of hits with an allowance)."""
        a = self.allowances
        # Hits the server would reject are asked as they are: its error is the answer.
        if a is None or not _hits_held(hits):
            resp = yield ("Check", _check_request(self.policy, key, hits), False, self.timeout)
            return _decision(resp.decision)
        local, due = a.spend(key, hits, time.monotonic())
        if local is not None:
            if due:
                self._refill(key, due)
            return local
        asked = a.ask(key, hits)
        while True:  # each ask smaller than the last, down to the request's own hits
            resp = yield ("Check", _check_request(self.policy, key, asked), False, self.timeout)
            d = _decision(resp.decision)
            following = a.answered(key, asked, hits, d, time.monotonic())
            if following is None:
                return replace(d, remaining=d.remaining + a.held(key)) if d.allowed else d
            asked = following

    def _refill(self, key: str, hits: int) -> None:
        """Asks for `hits` more on `key` without waiting (the allowance's refill): on the
        running event loop's grpc.aio channel when there is one (an ASGI or grpc.aio server
        starts no other thread for it), else on the synchronous channel; its answer, or none,
        goes to the allowance."""
        a = self.allowances
        if time.monotonic() < self._down_until:
            a.refilled(key, hits, None, time.monotonic())
            return
        msg = _check_request(self.policy, key, hits)
        with self._lock:
            self._refilling += 1
        aio = self._aio
        try:
            on_loop = aio is not None and aio[0] is asyncio.get_running_loop()
        except RuntimeError:  # no running loop: a thread of a synchronous server
            on_loop = False
        if on_loop:
            task = asyncio.ensure_future(self._refill_async(aio[2], key, hits, msg))
            self._pending.add(task)  # a reference until it is done
            task.add_done_callback(self._pending.discard)
            return
        future = self._sync_client()._stub.Check.future(msg, timeout=self.timeout)
        with self._lock:
            self._pending.add(future)  # held until done: grpc cancels a collected call

        def done(f) -> None:
            with self._lock:
                self._pending.discard(f)
            d = None
            try:
                if f.exception() is None:
                    d = _decision(f.result().decision)
            except Exception:  # noqa: BLE001 - cancelled (the channel closed): no answer
                pass
            self._refilled(key, hits, d)

        future.add_done_callback(done)

    async def _refill_async(self, stub, key: str, hits: int, msg) -> None:
        d = None
        try:
            d = _decision((await stub.Check(msg, timeout=self.timeout)).decision)
        except grpc.RpcError:
            pass
        finally:  # whatever ends it (an error, the loop cancelling it): the key may refill again
            self._refilled(key, hits, d)

    def _refilled(self, key: str, hits: int, d: Optional[Decision]) -> None:
        self.allowances.refilled(key, hits, d, time.monotonic())
        with self._lock:
            self._refilling -= 1

    def _admit_request(self, request: RequestInfo, key: str):
        msg = sluice_pb2.AdmitRequest(policy=self.policy, key=key,
                                      tenant=_value(self.tenant, request),
                                      upstream=_value(self.upstream, request),
                                      route=_value(self.route, request))
        if self.ttl is not None:
            msg.ttl.CopyFrom(_duration(self.ttl, "ttl"))
        msg.max_wait.CopyFrom(_duration(self.max_wait, "max_wait"))
        return msg

    def _failure(self, adm: Admission, err: Optional[SluiceError]) -> Admission:
        now = time.monotonic()
        adm.error = err
        if err is not None:
            if err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._down_until = now + self.unreachable_retry
            if now >= self._logged_down_until:  # one line per unreachable_retry at most
                self._logged_down_until = now + max(self.unreachable_retry, 1.0)
                log.warning("sluice %s, policy %s: %s; requests are %s", self.target,
                            self.policy, err,
                            "let through (fail open)" if self.fail_open
                            else "refused (fail closed)")
        if self.fail_open:
            adm.unchecked = True
            self._count("unchecked")
        else:
            adm.refusal = _unavailable_refusal(self.unreachable_retry)
            self._count("failed_closed")
        return adm

    def _finish(self, adm: Admission, outcome: str) -> Optional[Flow]:
        """The flow that releases `adm`'s lease with `outcome`; none when no RPC is needed (no
        lease, released already, or a kept lease, which waits for the next request of its
        key)."""
        if adm.lease is None or adm.lease.released:
            return None
        if adm.outcome is not None:
            outcome = adm.outcome
        if outcome not in _OUTCOME_ENUM:
            log.warning("policy %s: outcome %r is not one of %s; released as 'ignored'",
                        self.policy, outcome, ", ".join(OUTCOMES))
            outcome = "ignored"
        adm.lease.released = True
        adm.released_outcome = outcome
        adm.rtt = max(0.0, time.monotonic() - adm.started)
        if adm.kept is not None:
            self._ended(adm.kept, outcome, adm.rtt)
            return None
        return self._release_flow(adm, outcome)

    def _release_flow(self, adm: Admission, outcome: str) -> Flow:
        msg = sluice_pb2.ReleaseRequest(lease_id=adm.lease.lease_id,
                                        outcome=_OUTCOME_ENUM[outcome])
        msg.rtt.CopyFrom(_duration(adm.rtt, "rtt"))
        if adm.cost is not None:
            msg.cost = adm.cost
        try:
            yield ("Release", msg, self.background_release, self.timeout)
            self._count("released")
        except SluiceError as e:
            self._release_failed(e)

    # ---- kept leases (lease_reuse) ----

    def _reuse(self, adm: Admission) -> bool:
        """Admits `adm` on a lease a finished request of its key left, if one waits."""
        with self._lock:
            waiting = self._kept.get(adm.key)
            if not waiting:
                return False
            k = waiting.pop()
            if not waiting:
                del self._kept[adm.key]
            k.waiting = False
            now = time.monotonic()
            fresh = now - k.since < self.lease_reuse
            if fresh:
                self.stats["admitted"] += 1
                self.stats["reused"] += 1
            else:
                self._live.discard(k)
                calls, k.ended = k.ended, []
        if not fresh:
            self._send(k, calls, keep=False)  # waited too long to carry a request
            return False
        adm.lease = Lease(lease_id=k.lease.lease_id, ttl=k.lease.ttl, policy=self.policy,
                          admitted_at=now, reusable=True)
        adm.kept = k
        adm.reused = True
        adm.started = now
        return True

    def _kept_new(self, lease: Lease, key: str) -> _Kept:
        k = _Kept(lease, key, time.monotonic())
        with self._lock:
            self._live.add(k)
            if self._sweeper is None:
                self._sweeper = threading.Thread(target=self._sweep, daemon=True,
                                                 name="sluice-lease-reuse")
                self._sweeper.start()
        return k

    def _ended(self, k: _Kept, outcome: str, rtt: float) -> None:
        """A request on kept lease `k` ended: it waits for the next one, or is released."""
        report: List[Tuple[str, float]] = []
        with self._lock:
            k.ended.append((outcome, rtt))
            if k.retired or self._closing:
                self._live.discard(k)
                calls, k.ended = k.ended, []
            else:
                calls = []
                k.since = time.monotonic()
                k.waiting = True
                self._kept.setdefault(k.key, []).append(k)
                if len(k.ended) >= _MAX_UNREPORTED:
                    # All but this one, each followed by another request on the lease; this
                    # one waits for the next request, or goes with the release.
                    report, k.ended = k.ended[:-1], k.ended[-1:]
                    k.reported = k.since
        if calls:
            self._send(k, calls, keep=False)
        if report:
            self._send(k, report, keep=True)

    def _retire(self, k: _Kept) -> None:
        """No more requests on `k`: released now if it waits, else when its request ends."""
        with self._lock:
            k.retired = True
            if not k.waiting:
                return
            self._unpool(k)
            self._live.discard(k)
            calls, k.ended = k.ended, []
        self._send(k, calls, keep=False)

    def _unpool(self, k: _Kept) -> None:  # under _lock
        waiting = self._kept.get(k.key, [])
        if k in waiting:
            waiting.remove(k)
        if not waiting:
            self._kept.pop(k.key, None)
        k.waiting = False

    def _send(self, k: _Kept, calls: List[Tuple[str, float]], keep: bool) -> None:
        """A Release of `k` reporting `calls` (the last its own), not waited for: on the
        synchronous channel, whatever the driver, so that the sweeper can send it too."""
        if not calls:
            return
        outcome, rtt = calls[-1]
        msg = sluice_pb2.ReleaseRequest(lease_id=k.lease.lease_id, outcome=_OUTCOME_ENUM[outcome],
                                        keep=keep)
        msg.rtt.CopyFrom(_duration(rtt, "rtt"))
        for o, r in calls[:-1]:
            e = msg.earlier.add(outcome=_OUTCOME_ENUM[o])
            e.rtt.CopyFrom(_duration(r, "rtt"))
        future = self._sync_client()._stub.Release.future(msg, timeout=self.timeout)
        with self._lock:
            self._pending.add(future)
            self.stats["keeps" if keep else "released"] += 1

        def done(f) -> None:
            with self._lock:
                self._pending.discard(f)
            exc = f.exception()
            if exc is not None:
                self._release_failed(from_rpc_error(exc) if isinstance(exc, grpc.RpcError)
                                     else exc)
            if keep and (exc is not None or not f.result().kept):
                self._retire(k)

        future.add_done_callback(done)

    def _sweep(self) -> None:
        """Each lease_reuse: reports the requests of every kept lease carrying one, not
        reported for lease_reuse (with keep), and releases the leases that waited lease_reuse
        without a request; on close, releases them all."""
        while True:
            with self._kept_cv:
                if not self._closing:
                    self._kept_cv.wait(self.lease_reuse)
                closing = self._closing
                now = time.monotonic()
                done, due = [], []
                for k in list(self._live):
                    if k.waiting and (closing or now - k.since >= self.lease_reuse):
                        self._unpool(k)
                        self._live.discard(k)
                        calls, k.ended = k.ended, []
                        done.append((k, calls))
                    elif (not closing and not k.waiting and not k.retired and k.ended
                          and now - k.reported >= self.lease_reuse):
                        k.reported = now
                        calls, k.ended = k.ended, []
                        due.append((k, calls))
            for k, calls in done:
                self._send(k, calls, keep=False)
            for k, calls in due:
                self._send(k, calls, keep=True)
            if closing:
                return

    def refills_in_flight(self) -> int:
        """The allowance's refills asked and not answered yet (each within ``timeout``)."""
        with self._lock:
            return self._refilling

    def leases_waiting(self) -> int:
        """Kept leases waiting for a request now (``lease_reuse``)."""
        with self._lock:
            return sum(len(w) for w in self._kept.values())

    def _release_kept(self, wait: float = 5.0) -> None:
        """Releases every kept lease and waits (up to `wait` seconds) for the releases."""
        with self._kept_cv:
            self._closing = True
            self._kept_cv.notify_all()
            sweeper = self._sweeper
        if sweeper is not None:
            sweeper.join(wait)
        until = time.monotonic() + wait
        while time.monotonic() < until:
            with self._lock:
                futures = [f for f in self._pending if isinstance(f, grpc.Future) and not f.done()]
            if not futures:
                break
            futures[0].exception(timeout=max(0.0, until - time.monotonic()))

    def _release_failed(self, err: BaseException) -> None:
        self._count("release_errors")
        log.warning("sluice %s, policy %s: release failed (the lease expires after its TTL): %s",
                    self.target, self.policy, err)

    # ---- outcomes ----

    @staticmethod
    def outcome_of_http(status: Optional[int], exc: Optional[BaseException]) -> str:
        """The outcome of an HTTP request that answered `status` and/or raised `exc`."""
        if exc is not None:
            return outcome_for_exception(exc)
        if status is None:
            return "failed"  # the application answered nothing: the server answers 500
        return outcome_of_http(status)

    @staticmethod
    def outcome_of_grpc(code: Optional[grpc.StatusCode], exc: Optional[BaseException]) -> str:
        """The outcome of a gRPC call that ended with `code` (None: OK) and/or raised `exc`."""
        if code is not None and code != grpc.StatusCode.OK:
            return outcome_of_grpc(code)
        if exc is not None:
            return outcome_for_exception(exc)
        return "success"

    # ---- synchronous driver ----

    def _sync_client(self) -> Client:
        if self.client is None:
            with self._lock:
                if self.client is None:
                    self.client = Client(self.target, timeout=self.timeout,
                                         credentials=self._credentials, options=self._options)
        return self.client

    def _run(self, flow: Flow):
        stub = self._sync_client()._stub
        try:
            op = next(flow)
            while True:
                name, msg, background, deadline = op
                method = getattr(stub, name)
                if background:
                    future = method.future(msg, timeout=deadline)
                    # Held until done: grpc cancels a call whose future is collected.
                    with self._lock:
                        self._pending.add(future)
                    future.add_done_callback(self._sync_background_done)
                    op = flow.send(None)
                    continue
                try:
                    resp = method(msg, timeout=deadline)
                except grpc.RpcError as e:
                    op = flow.throw(from_rpc_error(e))
                else:
                    op = flow.send(resp)
        except StopIteration as stop:
            return stop.value

    def _sync_background_done(self, future) -> None:
        with self._lock:
            self._pending.discard(future)
        exc = future.exception()
        if exc is not None:
            self._release_failed(from_rpc_error(exc) if isinstance(exc, grpc.RpcError) else exc)

    def skipped(self, request: RequestInfo) -> bool:
        return self.skip is not None and bool(self.skip(request))

    def enter(self, request: RequestInfo) -> Admission:
        """Admits `request` (synchronously): an :class:`Admission`, refused or not."""
        adm, flow = self._start(request)
        return adm if flow is None else self._run(flow)

    def exit(self, adm: Admission, outcome: str) -> None:
        """Releases the admission's lease (if any) with `outcome` (``adm.outcome`` wins)."""
        flow = self._finish(adm, outcome)
        if flow is not None:
            self._run(flow)

    # ---- asynchronous driver (grpc.aio, one channel per event loop) ----

    def _aio_stub(self):
        loop = asyncio.get_running_loop()
        current = self._aio
        if current is None or current[0] is not loop:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(self.target, options=self._options)
            else:
                channel = grpc.aio.secure_channel(self.target, self._credentials,
                                                  options=self._options)
            current = (loop, channel, sluice_pb2_grpc.SluiceStub(channel))
            self._aio = current
        return current[2]

    async def _run_async(self, flow: Flow):
        stub = self._aio_stub()
        try:
            op = next(flow)
            while True:
                name, msg, background, deadline = op
                method = getattr(stub, name)
                if background:
                    task = asyncio.ensure_future(self._background(method(msg, timeout=deadline)))
                    self._pending.add(task)  # a reference until it is done
                    task.add_done_callback(self._pending.discard)
                    op = flow.send(None)
                    continue
                try:
                    resp = await method(msg, timeout=deadline)
                except grpc.RpcError as e:
                    op = flow.throw(from_rpc_error(e))
                else:
                    op = flow.send(resp)
        except StopIteration as stop:
            return stop.value

    async def _background(self, call) -> None:
        try:
            await call
        except grpc.RpcError as e:
            self._release_failed(from_rpc_error(e))

    async def enter_async(self, request: RequestInfo) -> Admission:
        """:meth:`enter` on the running event loop."""
        adm, flow = self._start(request)
        return adm if flow is None else await self._run_async(flow)

    async def exit_async(self, adm: Admission, outcome: str) -> None:
        """:meth:`exit` on the running event loop."""
        flow = self._finish(adm, outcome)
        if flow is not None:
            await self._run_async(flow)

    async def aclose(self) -> None:
        """Releases the kept leases (``lease_reuse``) and closes the grpc.aio channel of the
        running loop (if one was opened)."""
        await asyncio.get_running_loop().run_in_executor(None, self._release_kept)
        if self._own_client and self.client is not None:
            self.client.close()
        current, self._aio = self._aio, None
        if current is not None:
            await current[1].close()

    def close(self) -> None:
        """Releases the kept leases (``lease_reuse``) and closes the synchronous client, if the
        gate made it."""
        self._release_kept()
        if self._own_client and self.client is not None:
            self.client.close()

