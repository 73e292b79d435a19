"""An ASGI middleware that admits every HTTP request on a sluice policy (Starlette, FastAPI,
Quart, Django's ASGI handler, any ASGI 3 application)::

    from sluice_client.asgi import SluiceASGIMiddleware
    from sluice_client.adapters import header

    # Starlette, FastAPI:
    app.add_middleware(SluiceASGIMiddleware, policy="api-rate", key=header("x-api-key"))
    # any ASGI app:
    app = SluiceASGIMiddleware(app, policy="search", target="127.0.0.1:7070")

It speaks to the server over ``grpc.aio`` on the application's event loop (one channel per
loop, closed at the lifespan's shutdown), so an admission never blocks the loop. The arguments
and the behaviour (rate or concurrency policy, refusals, outcomes, failing open or closed) are
:class:`sluice_client.adapters.Gate`'s; the request's :class:`~sluice_client.adapters.Admission`
is :func:`sluice_client.adapters.current_admission` inside the application, and
``scope["state"]["sluice"]`` (Starlette: ``request.state.sluice``).

Only ``http`` requests are admitted; websocket connections and the lifespan pass through.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, MutableMapping, Optional

from .adapters import Admission, Gate, RequestInfo, _current

__all__ = ["SluiceASGIMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ASGIRequest(RequestInfo):
    __slots__ = ()

    def header(self, name: str) -> Optional[str]:
        wanted = name.lower().encode("latin-1")
        for k, v in self.raw.get("headers") or ():
            if k.lower() == wanted:
                return v.decode("latin-1")
        return None


class SluiceASGIMiddleware:
    """``SluiceASGIMiddleware(app, policy, **gate_options)``: see the module's doc and
    :class:`sluice_client.adapters.Gate` for the options (``target``, ``timeout``, ``kind``,
    ``key``, ``hits``, ``tenant``, ``upstream``, ``route``, ``ttl``, ``max_wait``, ``fail_open``,
    ``unreachable_retry``, ``background_release``, ``skip``)."""

    def __init__(self, app, policy: str, **options):
        if "client" in options:
            raise TypeError("client: the ASGI middleware makes its own grpc.aio channel; pass "
                            "target= (and credentials=, options=) instead")
        self.app = app
        self.gate = Gate(policy, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                return await self.app(scope, receive, self._lifespan_send(send))
            return await self.app(scope, receive, send)
        gate = self.gate
        request = ASGIRequest(scope["method"], scope["path"], scope)
        if gate.skipped(request):
            return await self.app(scope, receive, send)
        adm = await gate.enter_async(request)
        if adm.refusal is not None:
            return await self._refuse(adm, send)
        state = scope.get("state")
        if state is None:
            scope["state"] = state = {}
        state["sluice"] = adm
        if adm.lease is None:  # a rate policy (or unchecked): nothing to release
            token = _current.set(adm)
            try:
                return await self.app(scope, receive, send)
            finally:
                _current.reset(token)

        status: Optional[int] = None

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = _current.set(adm)
        try:
            await self.app(scope, receive, send_status)
        except BaseException as exc:
            await self._release(adm, gate.outcome_of_http(status, exc))
            raise
        finally:
            _current.reset(token)
        await self._release(adm, gate.outcome_of_http(status, None))

    async def _release(self, adm: Admission, outcome: str) -> None:
        try:
            await self.gate.exit_async(adm, outcome)
        except Exception as exc:  # noqa: BLE001 - the server expires the lease after its TTL
            self.gate._release_failed(exc)

    @staticmethod
    async def _refuse(adm: Admission, send: Send) -> None:
        refusal = adm.refusal
        body = refusal.body()
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                   for k, v in refusal.http_headers(body)]
        await send({"type": "http.response.start", "status": refusal.status,
                    "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _lifespan_send(self, send: Send) -> Send:
        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.gate.aclose()
            await send(message)

        return lifespan_send
