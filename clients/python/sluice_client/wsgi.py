"""A WSGI middleware that admits every request on a sluice policy (Flask, Django, Bottle,
Pyramid, any PEP 3333 application)::

    from sluice_client.wsgi import SluiceWSGIMiddleware

    app.wsgi_app = SluiceWSGIMiddleware(app.wsgi_app, policy="search")      # Flask
    application = SluiceWSGIMiddleware(application, policy="api-rate")      # any WSGI app

The arguments and the behaviour (rate or concurrency policy, refusals, outcomes, failing open or
closed) are :class:`sluice_client.adapters.Gate`'s; ``client=`` shares a
:class:`~sluice_client.Client` (thread-safe) with the rest of the application. The request's
:class:`~sluice_client.adapters.Admission` is ``environ["sluice.admission"]`` and
:func:`sluice_client.adapters.current_admission` inside the application.

A lease is released when the server closes the response (PEP 3333's ``close()``, after the last
byte of the body), so a streamed body counts to the end; the outcome is the status given to
``start_response`` (or the exception the application or its body raised).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from .adapters import Admission, Gate, RequestInfo, _current

__all__ = ["SluiceWSGIMiddleware"]


class WSGIRequest(RequestInfo):
    __slots__ = ()

    def header(self, name: str) -> Optional[str]:
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        return self.raw.get(key)


class SluiceWSGIMiddleware:
    """``SluiceWSGIMiddleware(app, policy, **gate_options)``: see the module's doc and
    :class:`sluice_client.adapters.Gate` for the options (``client`` or ``target`` and
    ``timeout``, ``kind``, ``key``, ``hits``, ``tenant``, ``upstream``, ``route``, ``ttl``,
    ``max_wait``, ``fail_open``, ``unreachable_retry``, ``background_release``, ``skip``)."""

    def __init__(self, app, policy: str, **options):
        self.app = app
        self.gate = Gate(policy, **options)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        gate = self.gate
        request = WSGIRequest(environ.get("REQUEST_METHOD", "GET"),
                              environ.get("PATH_INFO", "") or "/", environ)
        if gate.skipped(request):
            return self.app(environ, start_response)
        adm = gate.enter(request)
        if adm.refusal is not None:
            refusal = adm.refusal
            body = refusal.body()
            start_response(refusal.http_status_line(), refusal.http_headers(body))
            return [body]
        environ["sluice.admission"] = adm
        token = _current.set(adm)
        if adm.lease is None:  # a rate policy (or unchecked): nothing to release
            try:
                return self.app(environ, start_response)
            finally:
                _current.reset(token)

        status = [None]

        def start_response_status(status_line, headers, exc_info=None):
            try:
                status[0] = int(status_line[:3])
            except ValueError:
                status[0] = None
            return start_response(status_line, headers, exc_info)

        try:
            body = self.app(environ, start_response_status)
        except BaseException as exc:
            gate.exit(adm, gate.outcome_of_http(status[0], exc))
            raise
        finally:
            _current.reset(token)
        return _Body(body, gate, adm, status)


class _Body:
    """The application's response iterable, releasing the lease at close() (or at the
    exception its iteration raised)."""

    __slots__ = ("_body", "_iter", "_gate", "_adm", "_status", "_error")

    def __init__(self, body: Iterable[bytes], gate: Gate, adm: Admission, status: list):
        self._body = body
        self._iter = None
        self._gate = gate
        self._adm = adm
        self._status = status
        self._error: Optional[BaseException] = None

    def __iter__(self):
        self._iter = iter(self._body)
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._iter)
        except StopIteration:
            raise
        except BaseException as exc:
            self._error = exc
            raise

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        except BaseException as exc:
            self._error = self._error or exc
            raise
        finally:
            self._gate.exit(self._adm, self._gate.outcome_of_http(self._status[0], self._error))

    def __getattr__(self, name: str) -> Any:  # e.g. a file wrapper's attributes
        return getattr(self._body, name)
