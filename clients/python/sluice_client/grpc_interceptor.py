"""gRPC server interceptors that admit every call on a sluice policy: one for ``grpc.server``
(synchronous), one for ``grpc.aio.server`` (its calls to sluice on the server's event loop)::

    from sluice_client.grpc_interceptor import SluiceServerInterceptor, SluiceAioServerInterceptor

    server = grpc.server(executor, interceptors=[SluiceServerInterceptor("search")])
    server = grpc.aio.server(interceptors=[SluiceAioServerInterceptor("search")])

A refused call ends with ``RESOURCE_EXHAUSTED`` (a rate policy, or a concurrency policy's
chained rate policy: HTTP's 429) or ``UNAVAILABLE`` (a concurrency limit, or the sluice server
could not be asked with ``fail_open=False``: HTTP's 503); the status message is the problem's
title and detail, and the trailing metadata carries ``retry-after`` (whole seconds, rounded up),
``grpc-retry-pushback-ms`` (read by gRPC clients with a retry policy) and ``sluice-problem`` (the
RFC 9457 document as JSON). The handler is not called.

The key is the full method name (``/package.Service/Method``) unless ``key=`` says otherwise
(``sluice_client.adapters.header("x-tenant")`` reads the invocation metadata). A lease is held
until the handler returns (for a streamed response, until the stream ends) and released with
the outcome of the status code it ended with (``sluice_client.adapters``); a call whose client
went away is ``timeout`` if its deadline had passed, else ``ignored``. By default the gRPC health
and reflection services are not admitted (``skip=``): a load balancer's probes must not be
refused under load.

The other arguments and the behaviour are :class:`sluice_client.adapters.Gate`'s. On
``grpc.aio``, handlers may be coroutines, async generators, or coroutines that ``write()`` their
stream; a synchronous handler runs in a thread (``asyncio.to_thread``, the admission's context
with it), as it would in the server's migration thread pool.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Optional

import grpc

from .adapters import Admission, Gate, RequestInfo, _current

__all__ = ["SluiceServerInterceptor", "SluiceAioServerInterceptor", "skip_health_and_reflection"]

_UNADMITTED_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                        "/grpc.reflection.v1.ServerReflection/")


def skip_health_and_reflection(request: RequestInfo) -> bool:
    """The default ``skip``: the standard health and reflection services."""
    return request.path.startswith(_UNADMITTED_SERVICES)


class GrpcRequest(RequestInfo):
    __slots__ = ()

    def header(self, name: str) -> Optional[str]:
        wanted = name.lower()
        for k, v in self.raw.invocation_metadata or ():
            if k == wanted:
                return v if isinstance(v, str) else None
        return None


class _CallDetails:
    """A call's method and metadata, as its ``grpc.HandlerCallDetails`` has them (the request's
    ``raw``), read from its context: a wrapped handler is made once per method."""

    __slots__ = ("method", "invocation_metadata")

    def __init__(self, method: str, invocation_metadata: Any):
        self.method = method
        self.invocation_metadata = invocation_metadata


def _call_request(method: str, context) -> GrpcRequest:
    return GrpcRequest("", method, _CallDetails(method, context.invocation_metadata()),
                       route=method)


class _WrappedHandlers:
    """Each method's wrapped handler, made once and kept while the server's handler for it is
    the same object (a generic handler's lookup returns the one it holds)."""

    _MAX = 1024  # methods kept; past it, forgotten and made again

    def __init__(self, wrap: Callable[[Any, str], Any]):
        self._wrap = wrap
        self._by_method: dict = {}

    def get(self, method: str, handler):
        kept = self._by_method.get(method)
        if kept is not None and kept[0] is handler:
            return kept[1]
        wrapped = self._wrap(handler, method)
        if len(self._by_method) >= self._MAX:
            self._by_method.clear()
        self._by_method[method] = (handler, wrapped)
        return wrapped


class SluiceServerInterceptor(grpc.ServerInterceptor):
    """``SluiceServerInterceptor(policy, **gate_options)``: see the module's doc and
    :class:`sluice_client.adapters.Gate` for the options."""

    def __init__(self, policy: str, **options):
        options.setdefault("skip", skip_health_and_reflection)
        self.gate = Gate(policy, **options)
        self._wrapped = _WrappedHandlers(lambda handler, method: _wrap_handler(
            handler, lambda b: self._unary(b, method), lambda b: self._streaming(b, method)))

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if self.gate.skipped(GrpcRequest("", method, handler_call_details, route=method)):
            return handler
        return self._wrapped.get(method, handler)

    # ---- the wrapped behaviours ----

    def _admit(self, request: RequestInfo, context) -> Admission:
        adm = self.gate.enter(request)
        refusal = adm.refusal
        if refusal is not None:
            context.set_trailing_metadata(refusal.grpc_trailers())
            context.abort(refusal.grpc_code, refusal.grpc_message())  # raises
        return adm

    def _outcome(self, context, exc: Optional[BaseException]) -> str:
        if not context.is_active():  # the client went away (cancelled, or its deadline passed)
            remaining = context.time_remaining()
            return "timeout" if remaining is not None and remaining <= 0 else "ignored"
        return self.gate.outcome_of_grpc(context.code(), exc)

    def _unary(self, behaviour: Callable, method: str) -> Callable:
        gate = self.gate

        def admitted(request_or_iterator, context):
            adm = self._admit(_call_request(method, context), context)
            token = _current.set(adm)
            try:
                response = behaviour(request_or_iterator, context)
            except BaseException as exc:
                if adm.lease is not None:  # a rate policy's hits are spent: nothing to release
                    gate.exit(adm, self._outcome(context, exc))
                raise
            finally:
                _current.reset(token)
            if adm.lease is not None:
                gate.exit(adm, self._outcome(context, None))
            return response

        return admitted

    def _streaming(self, behaviour: Callable, method: str) -> Callable:
        gate = self.gate

        def admitted(request_or_iterator, context):
            adm = self._admit(_call_request(method, context), context)
            error: Optional[BaseException] = None
            token = _current.set(adm)  # the handler's body runs while it is iterated
            try:
                for response in behaviour(request_or_iterator, context):
                    yield response
            except BaseException as exc:
                error = exc
                raise
            finally:
                outcome = _stream_ended(adm, token, error, lambda e: self._outcome(context, e))
                if outcome is not None:
                    gate.exit(adm, outcome)

        return admitted


def _stream_ended(adm: Admission, token, error: Optional[BaseException],
                  outcome: Callable[[Optional[BaseException]], str]) -> Optional[str]:
    """After a streaming handler's last response (or its error): the admission's context
    variable restored, and the outcome to release the lease with (None: no lease, as a rate
    policy's hits are spent). A stream closed early (GeneratorExit: the client went away) is
    "ignored"; any other end is what `outcome` makes of its error."""
    try:
        _current.reset(token)
    except ValueError:  # resumed in another context: nothing of ours to undo
        pass
    if adm.lease is None:
        return None
    return "ignored" if isinstance(error, GeneratorExit) else outcome(error)


def _wrap_handler(handler, wrap_unary: Callable, wrap_streaming: Callable):
    """`handler` with its behaviour wrapped (unary or streaming responses)."""
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            wrap_unary(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            wrap_unary(handler.stream_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            wrap_streaming(handler.unary_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    return grpc.stream_stream_rpc_method_handler(
        wrap_streaming(handler.stream_stream),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)


_STREAM_END = object()


class SluiceAioServerInterceptor(grpc.aio.ServerInterceptor):
    """``SluiceAioServerInterceptor(policy, **gate_options)``, for ``grpc.aio.server``: the
    synchronous interceptor's behaviour, its Check, Admit and Release on a grpc.aio channel of
    the server's event loop. ``await interceptor.aclose()`` closes that channel."""

    def __init__(self, policy: str, **options):
        if "client" in options:
            raise TypeError("client: the grpc.aio interceptor makes its own grpc.aio channel; "
                            "pass target= (and credentials=, options=) instead")
        options.setdefault("skip", skip_health_and_reflection)
        self.gate = Gate(policy, **options)
        self._wrapped = _WrappedHandlers(lambda handler, method: _wrap_handler(
            handler, lambda b: self._unary(b, method), lambda b: self._streaming(b, method)))

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if self.gate.skipped(GrpcRequest("", method, handler_call_details, route=method)):
            return handler
        return self._wrapped.get(method, handler)

    async def aclose(self) -> None:
        await self.gate.aclose()

    async def _admit(self, request: RequestInfo, context) -> Admission:
        adm = await self.gate.enter_async(request)
        refusal = adm.refusal
        if refusal is not None:
            await context.abort(refusal.grpc_code, refusal.grpc_message(),
                                tuple(refusal.grpc_trailers()))  # raises
        return adm

    def _outcome(self, context, exc: Optional[BaseException]) -> str:
        if context.cancelled():  # the client went away (cancelled, or its deadline passed)
            remaining = context.time_remaining()
            return "timeout" if remaining is not None and remaining <= 0 else "ignored"
        code = context.code()
        if isinstance(code, int):  # grpc.aio may keep the code as the core's number
            code = next((c for c in grpc.StatusCode if c.value[0] == code), None)
        return self.gate.outcome_of_grpc(code, exc)

    async def _release(self, adm: Admission, outcome: str) -> None:
        try:
            await self.gate.exit_async(adm, outcome)
        except Exception as exc:  # noqa: BLE001 - the server expires the lease after its TTL
            self.gate._release_failed(exc)

    def _unary(self, behaviour: Callable, method: str) -> Callable:
        async def admitted(request_or_iterator, context):
            adm = await self._admit(_call_request(method, context), context)
            token = _current.set(adm)
            try:
                if inspect.iscoroutinefunction(behaviour):
                    response = await behaviour(request_or_iterator, context)
                else:  # a synchronous handler: in a thread, with this context
                    response = await asyncio.to_thread(behaviour, request_or_iterator, context)
            except BaseException as exc:
                if adm.lease is not None:
                    await self._release(adm, self._outcome(context, exc))
                raise
            finally:
                _current.reset(token)
            if adm.lease is not None:
                await self._release(adm, self._outcome(context, None))
            return response

        return admitted

    def _streaming(self, behaviour: Callable, method: str) -> Callable:
        if inspect.iscoroutinefunction(behaviour):  # writes its stream with context.write()
            return self._unary(behaviour, method)

        async def responses(request_or_iterator, context) -> Any:
            if inspect.isasyncgenfunction(behaviour):
                async for response in behaviour(request_or_iterator, context):
                    yield response
                return
            # A synchronous generator: each response taken from it in a thread.
            it = await asyncio.to_thread(behaviour, request_or_iterator, context)
            while True:
                response = await asyncio.to_thread(next, it, _STREAM_END)
                if response is _STREAM_END:
                    return
                yield response

        async def admitted(request_or_iterator, context):
            adm = await self._admit(_call_request(method, context), context)
            error: Optional[BaseException] = None
            token = _current.set(adm)
            try:
                async for response in responses(request_or_iterator, context):
                    yield response
            except BaseException as exc:
                error = exc
                raise
            finally:
                outcome = _stream_ended(adm, token, error, lambda e: self._outcome(context, e))
                if outcome is not None:
                    await self._release(adm, outcome)

        return admitted
