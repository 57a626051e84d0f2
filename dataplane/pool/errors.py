"""Typed errors of the page pool, residency and host tier.

Every error carries a stable machine-readable ``code`` (the agent maps codes to
HTTP responses and metric ``reason`` labels without parsing messages) and derives
from :class:`dataplane.errors.EngineError` through :class:`PoolError`. A call
that raises one of these before its visibility point changes nothing; a
transaction that fails after reserving pages rolls back first, then raises.
"""

from __future__ import annotations

from dataplane.errors import EngineError


class PoolError(EngineError):
    """Base of the pool's errors; ``str(exc)`` is ``"<code>: <message>"``, ``detail`` holds
    structured context."""

    code = "POOL_ERROR"
    code_in_str = True


class ConservationError(PoolError):
    """free + reserved + adapter + KV != total, or a page is in two states (a bug)."""

    code = "POOL_CONSERVATION_VIOLATED"


class PageOwnershipError(PoolError):
    """A page was named by an owner (or transaction) that does not hold it."""

    code = "PAGE_OWNERSHIP"


class IllegalTransition(PoolError):
    """A residency or slot state transition outside the allowed graph."""

    code = "ILLEGAL_RESIDENCY_TRANSITION"


class LayoutError(PoolError):
    """Factor shapes cannot be placed in this page geometry (e.g. a row wider than a page)."""

    code = "ADAPTER_LAYOUT"


class AdmissionRefused(PoolError):
    """free + reclaimable < demand: the request must queue (nothing was changed)."""

    code = "INSUFFICIENT_ELIGIBLE_PAGES"


class KvCapacityExhausted(PoolError):
    """KV growth found no free or reclaimable page: the scheduler must preempt."""

    code = "KV_CAPACITY_EXHAUSTED"


class ValidationFailed(PoolError):
    """Staged bytes failed a check (digest, layout, padded tail); nothing was published."""

    code = "ADAPTER_VALIDATION_FAILED"


class PublishBeforeCopy(PoolError):
    """Publication attempted while the copy-complete event has not completed."""

    code = "PUBLISH_BEFORE_COPY_EVENT"


class StaleGeneration(PoolError):
    """A slot handle's slot or pointer generation no longer matches (ABA defense)."""

    code = "STALE_SLOT_GENERATION"


class NotResident(PoolError):
    """The adapter generation named is not published on this worker."""

    code = "ADAPTER_NOT_RESIDENT"


class HostTierError(PoolError):
    """Host or disk cache miss, digest mismatch or budget too small for one artifact."""

    code = "HOST_TIER"


class RestoreFailed(PoolError):
    """Compensating rollback could not restore a victim; its pages were freed instead."""

    code = "VICTIM_RESTORE_FAILED"


class InjectedFault(PoolError):
    """A fault raised by :mod:`dataplane.pool.faults` (tests, chaos drills)."""

    code = "INJECTED_FAULT"
