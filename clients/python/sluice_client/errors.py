"""Exceptions raised by :mod:`sluice_client`.

Two kinds of trouble, kept apart on purpose:

* :class:`SluiceError` (and its subclasses) -- the call failed: the server answered with a gRPC
  error status (a malformed field, an unknown policy or lease, a call of the wrong family, the
  server shutting down, a deadline...). ``err.code`` is the :class:`grpc.StatusCode`,
  ``err.message`` the server's message, which names the offending field first
  (``"key: must not be empty"``); ``err.field`` is that name (``"key"``).

* :class:`Refused` -- the call worked and the answer is "no": Admit was not admitted, because a
  chained rate policy is over its rate (status 429) or a concurrency limit is reached (503).
  That is flow control, not a failure, so it is not a :class:`SluiceError`.

A denied :meth:`~sluice_client.Client.check` raises nothing: it returns a
:class:`~sluice_client.Decision` with ``allowed=False``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Optional

import grpc

__all__ = [
    "SluiceError",
    "InvalidArgument",
    "NotFound",
    "FailedPrecondition",
    "PermissionDenied",
    "Unavailable",
    "DeadlineExceeded",
    "Refused",
]

# "checks[1].hits: must be >= 1" -> "checks[1].hits"
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\[\]]*): ")


class SluiceError(Exception):
    """A gRPC call to the sluice server failed.

    Attributes:
        code: the :class:`grpc.StatusCode` the server (or the channel) returned.
        message: the status message; the server's messages start with the field at fault.
        field: that field's name (``"key"``, ``"policy"``, ``"checks[1].hits"``), or ``None``.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        m = _FIELD.match(message or "")
        self.field: Optional[str] = m.group(1) if m else None

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(SluiceError):
    """A request field is malformed (empty key, hits < 1, a bad lease id...)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(SluiceError):
    """No such policy, tenant/upstream, or lease (never issued, released, or expired)."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(SluiceError):
    """A call of the wrong family: Check on a concurrency policy, or Admit on a rate policy."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(SluiceError):
    """The server refused the caller."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(SluiceError):
    """The server cannot be reached, or is draining (shutting down)."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(SluiceError, TimeoutError):
    """The call did not finish within the client's timeout. Also a :class:`TimeoutError`."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, FailedPrecondition, PermissionDenied, Unavailable,
                DeadlineExceeded)
}


def from_rpc_error(err: grpc.RpcError) -> SluiceError:
    """The :class:`SluiceError` for a failed call (a subclass when the code has one)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = (err.details() if hasattr(err, "details") else None) or str(err)
    cls = _BY_CODE.get(code, SluiceError)
    return cls(message, code)


class Refused(Exception):
    """Admit answered "not admitted".

    Attributes:
        status: 429 (a chained rate policy is over its rate; no permit was taken) or 503 (a
            concurrency limit is reached).
        title, type, detail: the RFC 9457 problem's fields.
        retry_after: seconds until trying again makes sense, or ``None`` when the same call can
            never pass.
        policy: the policy that refused (the chained rate policy, or the one named).
        level: ``"rate"``, ``"limit"`` (adaptive/fleet) or the gateway level (``"tenant"``,
            ``"upstream"``, ``"binding"``, ``"per_tenant"``, ``"route"``).
        current, limit: in flight (or hits used) and the maximum, at the refusing level.
        problem: the full problem+json document, parsed (``{}`` if the server sent none).
        waited: seconds the call waited in a queue before this refusal (0: none).
    """

    def __init__(self, status: int, *, title: str = "", type: str = "", detail: str = "",
                 retry_after: Optional[float] = None, policy: str = "", level: str = "",
                 current: int = 0, limit: int = 0, problem_json: str = "",
                 waited: float = 0.0):
        self.status = status
        self.waited = waited
        self.title = title
        self.type = type
        self.detail = detail
        self.retry_after = retry_after
        self.policy = policy
        self.level = level
        self.current = current
        self.limit = limit
        self.problem_json = problem_json
        try:
            parsed: Any = json.loads(problem_json) if problem_json else {}
        except ValueError:
            parsed = {}
        self.problem: Dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        super().__init__(f"{status} {title}: {detail}" if title else f"{status}: {detail}")
