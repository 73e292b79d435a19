"""The values :class:`sluice_client.Client` returns. Durations are float seconds."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, NamedTuple, Optional

__all__ = ["Decision", "Charge", "CheckManyResult", "Lease", "PolicyState", "Policies",
           "OUTCOMES"]

# How a leased call ended (the server's Outcome enum):
#   "success"  it completed; its RTT is latency evidence for adaptive limits
#   "dropped"  it timed out or the backend refused it as overloaded: the limit should come down
#   "ignored"  it says nothing about the backend (cancelled, a client-side error)
#   "failed"   it failed, not from overload (a 500, a bad request): no latency evidence (adaptive
#              limits treat it as ignored), but a health signal for policies that track one
#   "timeout", "overload"  what a cascade's caller says of a drop (a timeout; a fast refusal as
#              overloaded, HTTP 429/503): the same as "dropped" to a limit, a failure to a node
OUTCOMES = ("success", "dropped", "ignored", "failed", "timeout", "overload")


@dataclass(frozen=True)
class Decision:
    """A rate policy's answer for one key.

    Attributes:
        allowed: whether the hits were allowed (and, for :meth:`Client.check`, debited).
        limit: the most hits the key may spend at once (for GCRA, the burst).
        remaining: hits still allowed now, after this request.
        reset_after: seconds until the key's allowance is whole again.
        retry_after: 0.0 when allowed; when denied, seconds until the same request would pass,
            or ``None`` when it never can (more hits than the policy allows at once).
        reason: when denied for more than the key's own limit, why (a federated policy:
            ``"budget_spent"``, ``"budget_short"``, ``"coordinator_unreachable"``,
            ``"coordinator_restarted"``, ``"spec_mismatch"``, ``"never_fits"``,
            ``"key_capacity"``, ``"regional_balance_spent"``); ``""`` otherwise.
        detail: with a reason, from :meth:`Client.check`, what the policy says of it (a
            ``"spec_mismatch"`` names the spec the coordinator holds the window under); ``""``
            otherwise.
        would_deny: allowed only because the policy runs in shadow: it would have refused, as
            ``reason`` and ``retry_after`` say; nothing was debited.
    """

    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: Optional[float]
    reason: str = ""
    detail: str = ""
    would_deny: bool = False


@dataclass(frozen=True)
class Charge:
    """A key's allowance after :meth:`Client.charge` (or a release with a ``cost``).

    Attributes:
        limit: the policy's limit (for GCRA, the burst).
        remaining: hits a check could take now.
        overdraft: hits charged past the limit that the key's later checks are waiting out
            (until the window ends; for GCRA, until the debt has drained); 0: none.
        pending: a federated policy's hits charged beyond this region's escrow, being taken
            from the global budget now; 0 otherwise.
        reset_after: seconds until the key's allowance is whole again.
        retry_after: seconds until a check of one hit could pass (0.0: now).
    """

    limit: int
    remaining: int
    overdraft: int
    pending: int
    reset_after: float
    retry_after: float


class CheckManyResult(NamedTuple):
    """The answer to :meth:`Client.check_many`; unpacks as ``allowed, decisions, denied_index``.

    Attributes:
        allowed: every check passed, and all were debited. If not, none was.
        decisions: one per check, in order, up to and including the first denial.
        denied_index: the index of the first denied check, ``None`` when allowed.
    """

    allowed: bool
    decisions: List[Decision]
    denied_index: Optional[int]


@dataclass
class Lease:
    """An admitted call. Release it (or let the :meth:`Client.lease` block do it).

    Attributes:
        lease_id: 32 hex digits; whoever knows it can release or extend the lease.
        ttl: seconds the lease lives without a heartbeat.
        policy: the policy that admitted it.
        admitted_at: :func:`time.monotonic` when the admission returned.
        outcome: inside a :meth:`Client.lease` block, set it to ``"success"``, ``"dropped"`` or
            ``"ignored"`` to choose the outcome reported at release; ``None``: decided on exit.
        released: set once the lease was released through the client.
        chosen: what the policy chose for the call (a cascade's node); empty when it names
            nothing.
        deadline: :func:`time.monotonic` by which the call must have ended (a fleet policy's
            call deadline: pass the time left on to the backend); ``None``: no deadline.
        waited: seconds the call waited in a queue before it was admitted (0: none).
        attributes: what the policy's kind answered beyond the above, by name (a string, or
            a list of strings for a name answered more than once).
        would_deny: admitted only because the policy runs in shadow: it would have refused the
            call, as ``rejection`` says; the lease holds no permit (release it all the same).
        rejection: with ``would_deny``, the :class:`~sluice_client.Refused` it would have
            raised; ``None`` otherwise.
        cost: inside a :meth:`Client.lease` block, set it to what the call cost its policy's
            chained rate policy, in hits (the tokens a model call used), once known: the
            release charges it (the admit took one); ``None``: nothing more.
        charged: after a release with a cost, the chained rate key's :class:`Charge`.
        reusable: the lease may carry its holder's next call (an adaptive policy's, chaining no
            rate policy): what ``Gate(lease_reuse=...)`` keeps.
    """

    lease_id: str
    ttl: float
    policy: str = ""
    admitted_at: float = field(default_factory=time.monotonic)
    outcome: Optional[str] = None
    released: bool = False
    chosen: str = ""
    deadline: Optional[float] = None
    waited: float = 0.0
    attributes: dict = field(default_factory=dict)
    would_deny: bool = False
    rejection: Optional[Exception] = None
    cost: Optional[int] = None
    charged: Optional[Charge] = None
    reusable: bool = False

    def time_left(self) -> Optional[float]:
        """Seconds until :attr:`deadline` (never negative); ``None``: no deadline."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def __str__(self) -> str:
        return self.lease_id


@dataclass(frozen=True)
class PolicyState:
    """One policy as :meth:`Client.policies` reports it.

    Attributes:
        name, kind: the policy's name and kind (``rate``, ``adaptive``, ``fleet``,
            ``concurrency``).
        rate: the chained rate policy's name, or ``""``.
        in_flight: concurrency kinds: calls holding a permit (leases included).
        limit: rate: hits per period; adaptive/fleet: the concurrency ceiling in force.
        state: every other detail (counters, fleet share...), as ``GET /v1/policies`` shows it.
    """

    name: str
    kind: str
    rate: str
    in_flight: int
    limit: int
    state: Dict[str, Any]

    @classmethod
    def _from_json(cls, name: str, kind: str, rate: str, in_flight: int, limit: int,
                   state_json: str) -> "PolicyState":
        try:
            state = json.loads(state_json) if state_json else {}
        except ValueError:
            state = {}
        return cls(name, kind, rate, in_flight, limit, state if isinstance(state, dict) else {})


@dataclass(frozen=True)
class Policies:
    """Every policy of the server, by name, plus the lease count and the config generation.

    Behaves as a read-only mapping: ``"api-rate" in ps``, ``ps["small"].in_flight``, ``len(ps)``,
    ``for name in ps``.
    """

    by_name: Dict[str, PolicyState]
    leases: int
    config_generation: int

    def __getitem__(self, name: str) -> PolicyState:
        return self.by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_name)

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str, default: Optional[PolicyState] = None) -> Optional[PolicyState]:
        return self.by_name.get(name, default)

    def names(self) -> List[str]:
        return sorted(self.by_name)
