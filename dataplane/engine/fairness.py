"""Tenant fairness of the scheduler: completed weighted service, weights, priority classes.

Torch-free. A request belongs to a tenant (the agent passes its alias's namespace; base
requests and library callers default to ""). Under the `fair` policy the scheduler admits,
among the waiting requests whose adapter is ready, the one with the lowest key

    (priority class, completed service / weight, age, adapter cost, arrival, request id)

(docs/ARCHITECTURE.md, "Scheduling"): a more urgent class first (high 0 < normal 1 < low 2);
then the tenant that has received the least completed weighted service per unit of
weight; then the oldest request, by the scheduling round it was queued in; among those
queued in the same round the cheapest adapter (`AdapterCost`, compared field by field:
bytes to load, new kernel runs, true rank, padded rank, pages); then arrival order.
With one tenant and one request per round this is arrival order, as `fcfs` is.

Completed service is credited only when work completes (`credit`): a prefill chunk when the
step that computed it is committed, an output token when it is applied. Planned rows of a
request aborted in between, failed steps and prefix-cache hits are never credited:

    W_u = INPUT_WEIGHT * completed input tokens + OUTPUT_WEIGHT * completed output tokens

A tenant that becomes backlogged (its first live request after none) has its service
lifted to the least normalised service of the tenants already backlogged, scaled by its
own weight, so an idle period is not banked as credit that would let it monopolise the
engine later (as in VTC's counter lift).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from dataplane.core import InvalidRequest

PRIORITY_CLASSES: dict[str, int] = {"high": 0, "normal": 1, "low": 2}
"""Priority class name -> urgency class (lower is admitted first)."""
DEFAULT_PRIORITY = PRIORITY_CLASSES["normal"]
POLICIES = ("fair", "fcfs", "newest_first")
"""Admission policies: `newest_first` is `fair` except under overload (engine/overload.py)."""
INPUT_WEIGHT = 1.0
OUTPUT_WEIGHT = 2.0
"""Weights of completed input (prefill) and output tokens in a tenant's service: a decode
token costs a step's row where a prompt token shares its row with a chunk."""
MAX_WEIGHT = 1000.0


class AdapterCost(NamedTuple):
    """What serving a request costs on top of its tokens, in separate units (never summed
    into one score): adapter bytes still to load, kernel runs its rows add to the step (0
    when its adapter already has rows there), the adapter's true rank and the rank its
    slot stores (padding), and adapter pages still to reserve. Lower sorts first."""

    load_bytes: int
    new_runs: int
    true_rank: int
    padded_rank: int
    pages: int


class TenantLedger:
    """Weights, priority classes and completed weighted service of every tenant."""

    def __init__(self) -> None:
        self.weights: dict[str, float] = {}
        self.priorities: dict[str, int] = {}
        self.service: dict[str, float] = {}
        """Tenant -> completed weighted service (`credit`), lifted on becoming backlogged."""
        self.live: dict[str, int] = {}
        """Tenant -> live requests (queued or running) in the scheduler."""

    def set_policy(self, weights: Mapping[str, float], priorities: Mapping[str, int]) -> None:
        """Replace every tenant's weight and priority class (tenants not named: weight 1,
        normal). Validated first: InvalidRequest with nothing changed."""
        for tenant, weight in weights.items():
            if (not isinstance(tenant, str) or isinstance(weight, bool)
                    or not isinstance(weight, int | float) or not math.isfinite(weight)
                    or not 0 < weight <= MAX_WEIGHT):
                raise InvalidRequest(f"a tenant weight must be a number in (0, {MAX_WEIGHT}]",
                                     tenant=str(tenant), weight=str(weight))
        classes = set(PRIORITY_CLASSES.values())
        for tenant, priority in priorities.items():
            if not isinstance(tenant, str) or isinstance(priority, bool) or priority not in classes:
                raise InvalidRequest(f"a tenant priority class must be one of {sorted(classes)}",
                                     tenant=str(tenant), priority=str(priority))
        self.weights = {t: float(w) for t, w in weights.items()}
        self.priorities = dict(priorities)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def priority(self, tenant: str) -> int:
        return self.priorities.get(tenant, DEFAULT_PRIORITY)

    def normalized(self, tenant: str) -> float:
        """Completed service per unit of weight."""
        return self.service.get(tenant, 0.0) / self.weight(tenant)

    def credit(self, tenant: str, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """A completion event: `input_tokens` prompt tokens computed, `output_tokens` tokens
        generated for `tenant`."""
        if input_tokens or output_tokens:
            self.service[tenant] = (self.service.get(tenant, 0.0)
                                    + INPUT_WEIGHT * input_tokens + OUTPUT_WEIGHT * output_tokens)

    def enter(self, tenant: str) -> None:
        """A request of `tenant` entered the scheduler (module docstring: the lift)."""
        if self.live.get(tenant, 0) == 0:
            backlogged = [self.normalized(t) for t, n in self.live.items() if n > 0]
            if backlogged:
                floor = min(backlogged) * self.weight(tenant)
                self.service[tenant] = max(self.service.get(tenant, 0.0), floor)
        self.live[tenant] = self.live.get(tenant, 0) + 1

    def leave(self, tenant: str) -> None:
        """A request of `tenant` finished or was aborted."""
        left = self.live.get(tenant, 0) - 1
        if left > 0:
            self.live[tenant] = left
        else:
            self.live.pop(tenant, None)

    def snapshot(self, tenants: Iterable[str] = ()) -> dict[str, float]:
        """Tenant -> completed service (every tenant seen, and `tenants`)."""
        out = dict(self.service)
        for tenant in tenants:
            out.setdefault(tenant, 0.0)
        return out
