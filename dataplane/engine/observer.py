"""Engine events for observers (metrics, the agent's residency bookkeeping).

An observer subscribes with `engine.observers.append(obs)`; the engine calls it on its own
thread, synchronously, and never depends on what it does (an observer changes nothing
about execution). Every method is a no-op here, so an observer overrides only what it
needs.
"""

from __future__ import annotations

from dataplane.core import BatchPlan, EngineError


class EngineObserver:
    """Base class of engine observers (see module docstring)."""

    def plan_launched(self, plan: BatchPlan, slot_ranks: dict[int, int]) -> None:
        """A step's plan is about to be enqueued (continuation plans too).
        `slot_ranks`: slot -> the true (largest) rank of the adapter bound there."""

    def launch_refused(self, error: EngineError) -> None:
        """A plan named a slot generation that is no longer published: nothing ran."""

    def adapter_evicted(self, key: str) -> None:
        """The pool evicted the idle adapter loaded under `key` (KV growth or another
        load's victim); its handle is no longer valid."""
