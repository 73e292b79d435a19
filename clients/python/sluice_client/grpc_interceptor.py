"""A gRPC server interceptor (``grpc.server``, synchronous) that admits every call on a sluice
policy::

    from sluice_client.grpc_interceptor import SluiceServerInterceptor

    server = grpc.server(executor, interceptors=[SluiceServerInterceptor("search")])

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

The other arguments and the behaviour are :class:`sluice_client.adapters.Gate`'s.
"""

from __future__ import annotations

from typing import Callable, Optional

import grpc

from .adapters import Admission, Gate, RequestInfo, _current

__all__ = ["SluiceServerInterceptor", "skip_health_and_reflection"]

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


class SluiceServerInterceptor(grpc.ServerInterceptor):
    """``SluiceServerInterceptor(policy, **gate_options)``: see the module's doc and
    :class:`sluice_client.adapters.Gate` for the options."""

    def __init__(self, policy: str, **options):
        options.setdefault("skip", skip_health_and_reflection)
        self.gate = Gate(policy, **options)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        request = GrpcRequest("", method, handler_call_details, route=method)
        if self.gate.skipped(request):
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, request),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, request),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, request),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, request),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

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

    def _unary(self, behaviour: Callable, request: RequestInfo) -> Callable:
        gate = self.gate

        def admitted(request_or_iterator, context):
            adm = self._admit(request, context)
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

    def _streaming(self, behaviour: Callable, request: RequestInfo) -> Callable:
        gate = self.gate

        def admitted(request_or_iterator, context):
            adm = self._admit(request, context)
            error: Optional[BaseException] = None
            token = _current.set(adm)  # the handler's body runs while it is iterated
            try:
                for response in behaviour(request_or_iterator, context):
                    yield response
            except BaseException as exc:
                error = exc
                raise
            finally:
                try:
                    _current.reset(token)
                except ValueError:  # resumed in another context: nothing of ours to undo
                    pass
                # GeneratorExit: the stream was closed early (the client went away).
                if adm.lease is not None:
                    gate.exit(adm, "ignored" if isinstance(error, GeneratorExit)
                              else self._outcome(context, error))

        return admitted
