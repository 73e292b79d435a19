"""sluice_client: a small Python client for ``sluice serve`` (gRPC API ``sluice.v1.Sluice``).

::

    from sluice_client import Client, Refused

    with Client("127.0.0.1:7070", timeout=2.0) as client:
        d = client.check("api-rate", key="user-42")          # rate: a Decision
        if not d.allowed:
            print("slow down; retry in", d.retry_after, "s")  # None: never passes

        try:
            with client.lease("search", key="user-42"):        # concurrency: admit ... release
                call_the_backend()
        except Refused as r:                                   # 429 (rate) or 503 (limit)
            print(r.status, r.detail, r.retry_after)

A ``cascade`` policy picks the healthiest node that has room; :meth:`Client.cascade` picks,
calls and reports::

        reply = client.cascade("replicas", lambda node: get(node, "/item/7"),
                               classify=lambda r: outcome_of_http(r.status), retries=1)

For the throttler's check API (HTTP), see :mod:`sluice_client.throttler`
(:class:`ThrottlerClient`, :func:`run_in_chunks`).

The generated stubs (``sluice.v1.sluice_pb2`` and ``sluice_pb2_grpc``) must be importable; they
are generated at build time from ``proto/sluice/v1/sluice.proto`` (see the README).
"""

from . import errors
from .cascade import (CASCADE_OUTCOMES, RetryBudget, outcome_for_exception, outcome_of_grpc,
                      outcome_of_http)
from .client import Client, Seconds
from .errors import *  # noqa: F401,F403  (the error classes; errors.__all__ lists them)
from .throttler import (Backoff, CheckResult, ChunkStats, ThrottledTimeout, ThrottlerClient,
                        run_in_chunks, wait_until_allowed)
from .types import OUTCOMES, Charge, CheckManyResult, Decision, Lease, Policies, PolicyState

__all__ = [
    "Client",
    "Seconds",
    "Decision",
    "Charge",
    "CheckManyResult",
    "Lease",
    "PolicyState",
    "Policies",
    "OUTCOMES",
    "CASCADE_OUTCOMES",
    "RetryBudget",
    "outcome_of_http",
    "outcome_of_grpc",
    "outcome_for_exception",
    "ThrottlerClient",
    "CheckResult",
    "Backoff",
    "ChunkStats",
    "ThrottledTimeout",
    "wait_until_allowed",
    "run_in_chunks",
] + errors.__all__
