"""What the device pool reports outward: monotonic counters (:class:`PoolStats`),
current gauges (:func:`pool_gauges`) and slot publication to listeners
(:class:`SlotListener`). Bounded labels only; no adapter ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dataplane.pool.residency import ResidencyState
from dataplane.pool.slot_table import PointerEntry, SlotState

if TYPE_CHECKING:
    from dataplane.pool.device_pool import DevicePool


@dataclass
class PoolStats:
    """Monotonic counters for metrics (bounded labels only; no adapter ids)."""

    loads_committed: int = 0
    loads_rolled_back: int = 0
    victims_restored: int = 0
    restore_failures: int = 0
    evictions: int = 0
    h2d_bytes: int = 0


class SlotListener(Protocol):
    """Told about slot publication (before the snapshot swap) and reclamation (after)."""

    def on_publish(self, entry: PointerEntry) -> None: ...

    def on_unpublish(self, slot: int) -> None: ...


def pool_gauges(pool: DevicePool) -> dict[str, dict[str, int]]:
    """Current pages by class, residencies by state, slots by state (for /metrics)."""
    states = {s.value: 0 for s in ResidencyState if s is not ResidencyState.ABSENT}
    for r in pool.residents.values():
        states[r.state.value] += 1
    slots = {s.value: 0 for s in SlotState}
    for i in range(pool.slots.num_slots):
        slots[pool.slots.state(i).value] += 1
    return {"pages": pool.pages.counts().as_dict(), "residency": states, "slots": slots}
