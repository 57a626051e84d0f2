"""The event spine (agent/event_ledger.py): the design's event fixture, and the denominators
of the derived ratios (failed attempts, wasted prefetches, rejections, uncommitted rows)."""

from __future__ import annotations

from agent.event_ledger import Event, EventLedger, Lookup


def test_event_fixture_two_arrivals_one_load_two_completions() -> None:
    """Two queue arrivals (h0 on resident A, c0 on cold B), one load of B, two selected
    iterations, two completions and two service debits: load-B-1 takes 1 tick, the
    completed queue waits are h0 0 and c0 3, and each class completed 1 unit."""
    ledger = EventLedger()
    ledger.enqueued("h0", 0, tenant="resident", lookup=Lookup.HIT, attempt="load-A-1")
    ledger.enqueued("c0", 0, tenant="cold", lookup=Lookup.COLD_MISS)
    ledger.selected("h0", 0)
    ledger.completed("h0", committed=True, service=1)
    ledger.load_started("load-B-1", "B", nbytes=300, t=2, prefetch=False)
    ledger.load_completed("load-B-1", 3, ok=True)
    ledger.published("load-B-1")
    ledger.bound("c0", "load-B-1")
    ledger.selected("c0", 3)
    ledger.completed("c0", committed=True, service=1)

    c = ledger.counts
    assert (c[Event.QUEUE_ENQUEUED], c[Event.ADAPTER_LOAD_STARTED],
            c[Event.ADAPTER_GENERATION_PUBLISHED], c[Event.ITERATION_SELECTED],
            c[Event.ITERATION_COMPLETED], c[Event.COMPLETED_SERVICE_DEBITED]) == (2, 1, 1, 2, 2, 2)
    assert list(ledger.load_latencies) == [("load-B-1", 1, True)]
    assert dict(ledger.queue_waits) == {"h0": 0, "c0": 3}
    assert ledger.tenant_service == {"resident": 1, "cold": 1}
    assert ledger.class_service == {"resident": 1, "cold-loaded": 1}
    assert ledger.cache_hit_rate() == 0.5
    assert ledger.load_amplification() == 1.0  # B's bytes, first used by c0


def test_failed_attempts_count_as_transferred_not_as_used() -> None:
    ledger = EventLedger()
    ledger.enqueued("d0", 0, tenant="t", lookup=Lookup.COLD_MISS)
    ledger.load_started("load-D-1", "D", nbytes=100, t=0, prefetch=False)
    ledger.load_completed("load-D-1", 1, ok=False)
    ledger.published("load-D-1")  # never published: ignored
    ledger.load_started("load-D-2", "D", nbytes=100, t=3, prefetch=False)
    ledger.load_completed("load-D-2", 3, ok=True)
    ledger.published("load-D-2")
    ledger.bound("d0", "load-D-2")
    ledger.selected("d0", 4)
    ledger.completed("d0", committed=True, service=1)
    assert ledger.counts[Event.ADAPTER_GENERATION_PUBLISHED] == 1
    assert ledger.load_amplification() == 2.0  # two transfers for one used generation
    assert [ok for _, _, ok in ledger.load_latencies] == [False, True]
    assert dict(ledger.queue_waits) == {"d0": 4}  # from the original arrival


def test_uncommitted_results_are_not_service() -> None:
    ledger = EventLedger()
    ledger.enqueued("r", 0, tenant="t", lookup=Lookup.BASE)
    ledger.selected("r", 1)
    ledger.completed("r", committed=False, service=5)
    assert ledger.counts[Event.ITERATION_COMPLETED] == 1
    assert ledger.counts[Event.COMPLETED_SERVICE_DEBITED] == 0
    assert ledger.tenant_service == {} and not ledger.queue_waits
    assert ledger.cache_hit_rate() is None  # base requests are not lookups


def test_prefetch_precision_and_waste() -> None:
    ledger = EventLedger()
    for n, used in ((1, True), (2, False)):
        attempt = f"load-P-{n}"
        ledger.prefetch_reserved()
        ledger.load_started(attempt, f"P{n}", nbytes=64, t=0, prefetch=True)
        ledger.load_completed(attempt, 1, ok=True)
        ledger.published(attempt)
        if used:
            ledger.enqueued("r", 2, tenant="t", lookup=Lookup.HIT, attempt=attempt)
            ledger.selected("r", 2)
            ledger.completed("r", committed=True, service=1)
        ledger.released(attempt, 5, pages=3)
    assert ledger.prefetch_precision() == 0.5
    assert (ledger.prefetch_wasted_pages, ledger.prefetch_wasted_bytes,
            ledger.prefetch_wasted_seconds) == (3, 64, 4)
    assert ledger.counts[Event.PREFETCH_RELEASED] == 2


def test_rejected_ratio_counts_rejections_in_offered() -> None:
    ledger = EventLedger()
    ledger.enqueued("a", 0, tenant="t", lookup=Lookup.STALE_MISS)
    ledger.rejected()
    ledger.rejected()
    assert ledger.offered == 3
    assert ledger.rejected_ratio() == 2 / 3
    assert ledger.cache_hit_rate() == 0.0  # a stale miss is a miss
    assert ledger.top_tenants(1) == []
