"""Which adapter loads to start for waiting requests, and how many pages they may take.

Torch-free. A request whose adapter is feasible but not ready is load-eligible
(engine/readiness.py): it may start a load, never get a model row. Three rules decide the
loads:

* **due**: a load-eligible request asks for its adapter's load once it has waited
  `min_age` (seconds, or scheduling rounds): the most urgent class first, then the
  oldest. Without this age trigger a policy that prefers resident adapters (no load
  cost) can leave a cold adapter unloaded forever while requests on resident adapters
  keep arriving;
* **budget**: loads and KV growth draw on one free-page counter. A load may take only
  the pages left after the growth already promised to admitted requests (each running
  request up to its maximum length) and a safety margin: it never takes a page an
  admitted request will need;
* **first fit**: the queue's distinct adapters, in queue order, each taken if its pages
  still fit the budget (a larger one that does not fit does not block a smaller one
  behind it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoadCandidate:
    """A waiting request's adapter: its urgency class (0 most urgent), when the request
    was queued, and the pages the adapter's load takes."""

    adapter: str
    pages: int
    queued_at: float
    urgency: int = 1


def due_loads(candidates: Iterable[LoadCandidate], now: float,
              min_age: float) -> list[LoadCandidate]:
    """The candidates that waited at least `min_age`, one per adapter, most urgent class
    first and then the oldest (by its oldest request)."""
    best: dict[str, LoadCandidate] = {}
    for c in candidates:
        if now - c.queued_at < min_age:
            continue
        held = best.get(c.adapter)
        if held is None or (c.urgency, c.queued_at) < (held.urgency, held.queued_at):
            best[c.adapter] = c
    return sorted(best.values(), key=lambda c: (c.urgency, c.queued_at, c.adapter))


def load_budget(free_pages: int, committed_kv_growth: int, safety: int = 0) -> int:
    """Pages loads may take now: free minus promised KV growth minus the safety margin."""
    return max(0, free_pages - committed_kv_growth - safety)


def first_fit(queue: Iterable[tuple[str, int]], available: int) -> list[str]:
    """The adapters to load from `queue` ((adapter, pages) in queue order, repeats
    allowed): each distinct adapter in order, taken when its pages fit what is left."""
    chosen: list[str] = []
    seen: set[str] = set()
    for adapter, pages in queue:
        if adapter in seen:
            continue
        seen.add(adapter)
        if pages <= available:
            chosen.append(adapter)
            available -= pages
    return chosen
