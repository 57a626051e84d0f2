"""Overload: which waiting requests are still serviceable, and in what order.

Torch-free. A request with a latency limit is *feasible* while it can still start in time:
``now - arrival + estimated wait <= limit`` (the scheduler drops the others unstarted,
engine/scheduler.py). Under the `newest_first` policy the scheduler compares two moving
rates: arrivals (`RateMeter` over the last requests added) and admissions (over the last
requests admitted). While requests arrive faster than they are admitted the queue only
grows, and serving the oldest first would spend the engine on requests about to miss
their limit while the newer ones age past theirs too; so it admits the newest feasible
requests first (S-LoRA's early-abort policy). Otherwise (also before either rate has an
estimate), and under `fair` / `fcfs`, the oldest first. Newest-first sacrifices old
requests for the new ones; whether that raises goodput (requests that meet their limit
per second) depends on the load (bench/fairness.py `overload-ramp` measures it); it is
not a fairness rule.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """A waiting request: its id, arrival time and latency limit (None: no limit)."""

    request_id: str
    arrival: float
    max_latency: float | None = None


def can_start_in_time(deadline: float | None, now: float, estimated_wait: float) -> bool:
    """A request with start `deadline` (None: none) can still start by it."""
    return deadline is None or now + estimated_wait <= deadline


def overloaded(arrival_rate: float | None, admission_rate: float | None) -> bool:
    """Requests arrive faster than they are admitted (False until both rates exist)."""
    return arrival_rate is not None and admission_rate is not None and \
        arrival_rate > admission_rate


def serviceable_choice(candidates: Iterable[Candidate], now: float, estimated_wait: float,
                       count: int, arrival_rate: float, admission_rate: float) -> list[str]:
    """The `count` feasible requests to admit: the newest first under overload, else the
    oldest first (the rule the scheduler's `newest_first` policy applies each round)."""
    ok = [c for c in candidates if can_start_in_time(
        None if c.max_latency is None else c.arrival + c.max_latency, now, estimated_wait)]
    newest = overloaded(arrival_rate, admission_rate)
    ok.sort(key=lambda c: (-c.arrival if newest else c.arrival, c.request_id))
    return [c.request_id for c in ok[:count]]


class RateMeter:
    """Events per second over the last `window` events."""

    def __init__(self, window: int = 64) -> None:
        self.times: deque[float] = deque(maxlen=window)

    def add(self, t: float) -> None:
        self.times.append(t)

    def rate(self, now: float) -> float | None:
        """None with fewer than two events (no estimate yet); else the events after the
        first over the time from the first to `now`."""
        if len(self.times) < 2:
            return None
        span = now - self.times[0]
        return (len(self.times) - 1) / span if span > 0 else float("inf")
