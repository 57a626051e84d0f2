"""The agent's event spine: every serving metric advances at one named event.

Torch-free. A number is meaningful only once the state transition that makes it true has
happened, so the ledger has one method per event and each aggregate moves only there:

==============================  ====================================================
event                           what becomes true (what it counts)
==============================  ====================================================
queue_enqueued                  a request's arrival and identity; cache hit or miss
                                (cold, or stale: a slot holds another generation)
request_rejected                refused at admission (counts against offered)
prefetch_reserved               pages reserved for a load nobody asked for yet
adapter_load_started            a transfer attempt began (its attempt id, bytes)
adapter_load_completed          the attempt ended: copied, or failed (rolled back)
adapter_generation_published    the copy validated and its slot generation is visible
iteration_selected              a request got its first rows (its queue wait ends)
iteration_completed             a request's result is known (committed or not)
completed_service_debited       its tenant's completed service advances
prefetch_released               a prefetched generation left its slot: used or wasted
==============================  ====================================================

Derived ratios keep the denominators that give them their meaning:

* cache hit rate = hits / (hits + cold misses + stale misses);
* prefetch precision = prefetched generations used before they left / prefetched
  generations published;
* load amplification = adapter bytes transferred (every attempt, failed ones included) /
  bytes of the generations a completed request first used;
* rejected ratio = rejected / offered (offered = enqueued + rejected).

Per-tenant and per-adapter-class service live here (a state store: `/v1/agent/state` and
the bounded top-k endpoint), never as metric labels. Request and attempt records are kept
only while live; the finished ones leave a bounded recent history.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class Event(enum.StrEnum):
    QUEUE_ENQUEUED = "queue_enqueued"
    REQUEST_REJECTED = "request_rejected"
    PREFETCH_RESERVED = "prefetch_reserved"
    ADAPTER_LOAD_STARTED = "adapter_load_started"
    ADAPTER_LOAD_COMPLETED = "adapter_load_completed"
    ADAPTER_GENERATION_PUBLISHED = "adapter_generation_published"
    ITERATION_SELECTED = "iteration_selected"
    ITERATION_COMPLETED = "iteration_completed"
    COMPLETED_SERVICE_DEBITED = "completed_service_debited"
    PREFETCH_RELEASED = "prefetch_released"


class Lookup(enum.StrEnum):
    """What admission found for a request's adapter generation."""

    BASE = "base"
    HIT = "hit"
    COLD_MISS = "cold_miss"
    STALE_MISS = "stale_miss"


RECENT = 256
"""Finished requests and load attempts kept for inspection."""


@dataclass
class _Request:
    enqueued: float
    tenant: str
    adapter_class: str
    attempt: str | None
    selected: float | None = None


@dataclass
class _Attempt:
    adapter: str
    nbytes: int
    started: float
    prefetch: bool
    completed: float | None = None
    ok: bool | None = None
    used: bool = False


@dataclass
class EventLedger:
    """Aggregates of the event spine (module docstring)."""

    counts: dict[Event, int] = field(default_factory=lambda: dict.fromkeys(Event, 0))
    lookups: dict[Lookup, int] = field(default_factory=lambda: dict.fromkeys(Lookup, 0))
    bytes_transferred: int = 0
    bytes_first_used: int = 0
    prefetch_published: int = 0
    prefetch_used: int = 0
    prefetch_wasted_pages: int = 0
    prefetch_wasted_bytes: int = 0
    prefetch_wasted_seconds: float = 0.0
    tenant_service: dict[str, float] = field(default_factory=dict)
    class_service: dict[str, float] = field(default_factory=dict)
    """Completed service by adapter class: `resident` (admitted on a hit), `cold-loaded`
    (waited for a load), `base`."""
    queue_waits: deque[tuple[str, float]] = field(default_factory=lambda: deque(maxlen=RECENT))
    """(request id, enqueue -> first selection) of recently completed requests."""
    load_latencies: deque[tuple[str, float, bool]] = field(
        default_factory=lambda: deque(maxlen=RECENT))
    """(attempt id, start -> end, ok) of recently ended load attempts."""
    _requests: dict[str, _Request] = field(default_factory=dict)
    _attempts: dict[str, _Attempt] = field(default_factory=dict)

    def _count(self, event: Event) -> None:
        self.counts[event] += 1

    # ----- events -----------------------------------------------------------------------
    def enqueued(self, request_id: str, t: float, tenant: str, lookup: Lookup,
                 attempt: str | None = None) -> None:
        """queue_enqueued: `attempt` is the load generation a hit runs on (set later by
        `bound` for a miss)."""
        self._count(Event.QUEUE_ENQUEUED)
        self.lookups[lookup] += 1
        cls = {Lookup.BASE: "base", Lookup.HIT: "resident"}.get(lookup, "cold-loaded")
        self._requests[request_id] = _Request(t, tenant, cls, attempt)

    def bound(self, request_id: str, attempt: str | None) -> None:
        """A waiting request's adapter was published by load `attempt` (no event: the
        publication was already counted)."""
        req = self._requests.get(request_id)
        if req is not None:
            req.attempt = attempt

    def rejected(self) -> None:
        """request_rejected: refused before it was queued."""
        self._count(Event.REQUEST_REJECTED)

    def prefetch_reserved(self) -> None:
        self._count(Event.PREFETCH_RESERVED)

    def load_started(self, attempt: str, adapter: str, nbytes: int, t: float,
                     prefetch: bool) -> None:
        self._count(Event.ADAPTER_LOAD_STARTED)
        self._attempts[attempt] = _Attempt(adapter, nbytes, t, prefetch)

    def load_completed(self, attempt: str, t: float, ok: bool) -> None:
        """adapter_load_completed: the attempt's transfer ended (a failed one is closed
        here: its bytes still count as transferred)."""
        rec = self._attempts.get(attempt)
        if rec is None or rec.completed is not None:
            return
        self._count(Event.ADAPTER_LOAD_COMPLETED)
        rec.completed, rec.ok = t, ok
        self.bytes_transferred += rec.nbytes
        self.load_latencies.append((attempt, t - rec.started, ok))
        if not ok:
            self._attempts.pop(attempt)

    def published(self, attempt: str) -> None:
        """adapter_generation_published."""
        rec = self._attempts.get(attempt)
        if rec is None or not rec.ok:
            return
        self._count(Event.ADAPTER_GENERATION_PUBLISHED)
        if rec.prefetch:
            self.prefetch_published += 1

    def selected(self, request_id: str, t: float) -> None:
        """iteration_selected: the request's first rows were planned (later ones are not
        queue waits)."""
        req = self._requests.get(request_id)
        if req is not None and req.selected is None:
            self._count(Event.ITERATION_SELECTED)
            req.selected = t

    def completed(self, request_id: str, committed: bool, service: float = 0.0) -> None:
        """iteration_completed, then for a committed result completed_service_debited
        (`service`: the request's completed weighted service)."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        self._count(Event.ITERATION_COMPLETED)
        if not committed:
            return
        self._count(Event.COMPLETED_SERVICE_DEBITED)
        self.tenant_service[req.tenant] = self.tenant_service.get(req.tenant, 0.0) + service
        self.class_service[req.adapter_class] = (
            self.class_service.get(req.adapter_class, 0.0) + service)
        if req.selected is not None:
            self.queue_waits.append((request_id, req.selected - req.enqueued))
        rec = self._attempts.get(req.attempt) if req.attempt else None
        if rec is not None and not rec.used:
            rec.used = True
            self.bytes_first_used += rec.nbytes
            if rec.prefetch:
                self.prefetch_used += 1

    def released(self, attempt: str | None, t: float, pages: int = 0) -> None:
        """The generation of `attempt` left its slot (evicted, reclaimed, unloaded); for a
        prefetched one this is prefetch_released, wasted when no completed request used
        it (its pages, bytes and the seconds it sat resident)."""
        rec = self._attempts.pop(attempt, None) if attempt else None
        if rec is None or not rec.prefetch:
            return
        self._count(Event.PREFETCH_RELEASED)
        if not rec.used:
            self.prefetch_wasted_pages += pages
            self.prefetch_wasted_bytes += rec.nbytes
            self.prefetch_wasted_seconds += t - (rec.completed or rec.started)

    # ----- derived ----------------------------------------------------------------------
    @property
    def offered(self) -> int:
        return self.counts[Event.QUEUE_ENQUEUED] + self.counts[Event.REQUEST_REJECTED]

    def cache_hit_rate(self) -> float | None:
        hits = self.lookups[Lookup.HIT]
        total = hits + self.lookups[Lookup.COLD_MISS] + self.lookups[Lookup.STALE_MISS]
        return hits / total if total else None

    def prefetch_precision(self) -> float | None:
        n = self.prefetch_published
        return self.prefetch_used / n if n else None

    def load_amplification(self) -> float | None:
        used = self.bytes_first_used
        return self.bytes_transferred / used if used else None

    def rejected_ratio(self) -> float | None:
        offered = self.offered
        return self.counts[Event.REQUEST_REJECTED] / offered if offered else None

    def top_tenants(self, k: int) -> list[tuple[str, float]]:
        """The `k` tenants with the most completed service (ties by name)."""
        return sorted(self.tenant_service.items(), key=lambda kv: (-kv[1], kv[0]))[:k]

    def summary(self) -> dict[str, object]:
        """Counters and ratios for `/v1/agent/state` (no identities)."""
        return {"events": {e.value: n for e, n in self.counts.items()},
                "lookups": {k.value: n for k, n in self.lookups.items()},
                "cache_hit_rate": self.cache_hit_rate(),
                "prefetch_precision": self.prefetch_precision(),
                "load_amplification": self.load_amplification(),
                "rejected_ratio": self.rejected_ratio(),
                "prefetch_wasted": {"pages": self.prefetch_wasted_pages,
                                    "bytes": self.prefetch_wasted_bytes,
                                    "seconds": self.prefetch_wasted_seconds},
                "adapter_class_service": dict(self.class_service)}
