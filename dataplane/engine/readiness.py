"""Adapter readiness: five predicates decide whether a request may get model rows.

Torch-free. A request bound to an adapter goes through separate predicates, never one
blended score (an affinity bonus must not make an unsupported or stale request look
runnable):

1. **feasible** — the worker can serve it at all: same base model, the adapter's target
   modules among the worker's, every module rank within the worker's limit, a layout the
   worker's kernels read, the generation asked for equal to the request's lease (the
   generation it bound at admission and keeps for its life, even after a republish), and
   a joint adapter + KV reservation that could be made;
2. **ready** — feasible, and the slot serving the digest is resident (or retiring while
   this very request holds a lease on it), its copy event is complete and its published
   generation is the one asked for;
3. **eligible** — ready and within the step's budgets: only eligible requests get rows;
4. **preferred** — an order over the eligible ones (the scheduler's key); it can never
   repair a failed predicate;
5. **selected / completed** — the rows a step plans, and of those the ones whose result
   was committed (only those count as service, engine/fairness.py).

A feasible request that is not ready is *load-eligible*: it may start a load transaction
(reserve, copy, validate, publish) but gets no model row until the slot is published.
The engine's readiness check (`AdapterRegistry.is_ready`) and the agent's admission use
`slot_ready`; `classify` applies all of it to one snapshot of requests and slots.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


class Residency(enum.Enum):
    """Where the adapter is on the worker."""

    COLD = "cold"
    LOADING = "loading"
    RESIDENT = "resident"
    RETIRING = "retiring"
    FAILED = "failed"


class Reason(enum.Enum):
    """Why a request is not ready (stable codes)."""

    OK = "ok"
    BASE_MISMATCH = "base_mismatch"
    TARGETS_UNSUPPORTED = "targets_unsupported"
    RANK_UNSUPPORTED = "rank_unsupported"
    LAYOUT_UNSUPPORTED = "layout_unsupported"
    STALE_GENERATION = "stale_generation"
    NO_RESERVATION = "no_reservation"
    NOT_RESIDENT = "not_resident"
    COPY_PENDING = "copy_pending"
    GENERATION_NOT_PUBLISHED = "generation_not_published"


@dataclass(frozen=True)
class WorkerContract:
    """What one worker can serve: its base, target modules, rank limit and layouts."""

    base_digest: str
    targets: frozenset[str]
    max_rank: int
    layouts: frozenset[str]


@dataclass(frozen=True)
class AdapterRequest:
    """A request's adapter record: the digest and generation it asks for, that adapter's
    base, module ranks and layout, and the generation it leased at admission (None: it
    holds no lease)."""

    request_id: str
    digest: str
    generation: int
    base_digest: str
    ranks: Mapping[str, int]
    layout: str
    lease_generation: int | None
    tenant: str = ""
    basis: str | None = None


@dataclass(frozen=True)
class SlotView:
    """The worker's slot for one digest: residency, copy event, published generation and
    the requests holding a lease on it."""

    state: Residency
    published_generation: int | None = None
    copy_complete: bool = False
    leases: frozenset[str] = frozenset()


COLD_SLOT = SlotView(Residency.COLD)


def infeasibility(req: AdapterRequest, worker: WorkerContract,
                  reserve_possible: bool = True) -> Reason:
    """The first feasibility condition `req` fails on `worker`; Reason.OK when feasible."""
    if req.base_digest != worker.base_digest:
        return Reason.BASE_MISMATCH
    if not set(req.ranks) <= worker.targets:
        return Reason.TARGETS_UNSUPPORTED
    if any(r > worker.max_rank for r in req.ranks.values()):
        return Reason.RANK_UNSUPPORTED
    if req.layout not in worker.layouts:
        return Reason.LAYOUT_UNSUPPORTED
    if req.lease_generation != req.generation:
        return Reason.STALE_GENERATION
    if not reserve_possible:
        return Reason.NO_RESERVATION
    return Reason.OK


def slot_ready(state: Residency, copy_complete: bool, published_generation: int | None,
               generation: int, leased: bool) -> Reason:
    """Readiness of a feasible request for `generation` on a slot (Reason.OK: ready)."""
    if not (state is Residency.RESIDENT or (state is Residency.RETIRING and leased)):
        return Reason.NOT_RESIDENT
    if not copy_complete:
        return Reason.COPY_PENDING
    if published_generation != generation:
        return Reason.GENERATION_NOT_PUBLISHED
    return Reason.OK


@dataclass(frozen=True)
class Verdict:
    """One request's predicates in one snapshot."""

    request: AdapterRequest
    feasible: bool
    ready: bool
    reason: Reason

    @property
    def load_eligible(self) -> bool:
        """Feasible, not ready, and no copy of it under way: may start a load."""
        return self.feasible and not self.ready and self.reason is Reason.NOT_RESIDENT


def judge(req: AdapterRequest, worker: WorkerContract, slot: SlotView,
          reserve_possible: bool = True) -> Verdict:
    """Feasibility, then readiness, of `req` on `worker` given its digest's `slot`."""
    reason = infeasibility(req, worker, reserve_possible)
    if reason is not Reason.OK:
        return Verdict(req, False, False, reason)
    reason = slot_ready(slot.state, slot.copy_complete, slot.published_generation,
                        req.generation, req.request_id in slot.leases)
    return Verdict(req, True, reason is Reason.OK, reason)


def classify(requests: Iterable[AdapterRequest], worker: WorkerContract,
             slots: Mapping[str, SlotView],
             reserve_possible: Callable[[AdapterRequest], bool] = lambda _r: True
             ) -> list[Verdict]:
    """Every request's verdict; `slots` maps digest -> its slot (absent: cold)."""
    return [judge(r, worker, slots.get(r.digest, COLD_SLOT), reserve_possible(r))
            for r in requests]


def select(verdicts: Iterable[Verdict], key: Callable[[AdapterRequest], object],
           budget: int) -> list[AdapterRequest]:
    """The step's plan: the `budget` ready requests that sort first by the preference
    `key` (lower first). Requests that are not ready are never selected."""
    ready = sorted((v.request for v in verdicts if v.ready), key=key)  # type: ignore[arg-type]
    return ready[:max(budget, 0)]
