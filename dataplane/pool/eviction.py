"""Victim selection: a hard eligibility predicate first, then a ranking among survivors.

Eligibility is a safety proof; ranking (LRU by default) is only
policy and never sees an ineligible object. Reuse of the pages is a third step owned by
the transaction (after the victim is unpublished and its events are complete).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from dataplane.pool.errors import AdmissionRefused
from dataplane.pool.residency import Residency, ResidencyState

LiveGenerations = Collection[tuple[str, int]]
"""``(key, generation)`` pairs named by live launch snapshots."""

Ranking = Callable[[Residency], Any]
"""Sort key over eligible victims; smallest is evicted first."""


def ineligibility(res: Residency, live: LiveGenerations) -> str | None:
    """The first reason ``res`` may not be evicted, or ``None`` when it may."""
    if res.state not in (ResidencyState.PUBLISHED, ResidencyState.IDLE):
        return f"state {res.state.value}"
    if res.refcount:
        return "referenced"
    if res.pin_count:
        return "pinned"
    if res.queued_reservations:
        return "queued reservation"
    if res.inflight_events:
        return "in-flight event"
    if (res.key, res.generation) in live:
        return "named by a live launch"
    if not res.host_source_verified:
        return "no verified host source"
    return None


def is_eligible(res: Residency, live: LiveGenerations) -> bool:
    return ineligibility(res, live) is None


def lru_rank(res: Residency) -> tuple[int, int, str]:
    """Least recently touched first, then the larger object, then stable identity."""
    return (res.last_touch, -len(res.pages), res.key)


def reclaimable_pages(residents: Iterable[Residency], live: LiveGenerations) -> int:
    return sum(len(r.pages) for r in residents if is_eligible(r, live))


def choose_victims(
    residents: Iterable[Residency],
    pages_needed: int,
    live: LiveGenerations,
    rank: Ranking = lru_rank,
) -> list[Residency]:
    """Fewest-in-rank-order eligible victims whose pages cover ``pages_needed``.

    Returns ``[]`` when ``pages_needed <= 0``; raises :class:`AdmissionRefused` when all
    eligible pages together are not enough (nothing is marked).
    """
    if pages_needed <= 0:
        return []
    victims: list[Residency] = []
    reclaimed = 0
    for res in sorted((r for r in residents if is_eligible(r, live)), key=rank):
        victims.append(res)
        reclaimed += len(res.pages)
        if reclaimed >= pages_needed:
            return victims
    raise AdmissionRefused(f"eligible victims hold {reclaimed} pages, need {pages_needed}",
                           reclaimable=reclaimed, needed=pages_needed)
