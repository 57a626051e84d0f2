"""Kernel adapter slots, the generation-stamped pointer table, and live launch snapshots.

A slot handle is valid only as the whole tuple
``(slot_id, slot_generation, pointer_generation, artifact_digest)``. Each slot carries
its own slot and pointer generations: reserving a slot bumps its slot generation,
publishing bumps its pointer generation, and discarding or reclaiming bumps both, so a
delayed stale handle never validates again when the slot is reused (ABA defense).

Publication is one swap of an immutable :class:`PointerTable` snapshot (copy-on-write
mapping + one reference assignment): a reader holding a snapshot sees the old complete
mapping or the new one, never a mix. Publication is refused while the copy-complete
event has not completed.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dataplane.pool.errors import IllegalTransition, PublishBeforeCopy, StaleGeneration
from dataplane.pool.events import CopyEvent
from dataplane.pool.page_demand import RowPlan


@dataclass(frozen=True)
class SlotHandle:
    slot_id: int
    slot_generation: int
    pointer_generation: int
    artifact_digest: str


@dataclass(frozen=True)
class PointerEntry:
    """What a launch may read for one slot: the handle, its pages and row placement."""

    handle: SlotHandle
    residency_generation: int
    pages: tuple[int, ...]
    plan: RowPlan

    @property
    def key(self) -> str:
        return self.handle.artifact_digest


@dataclass(frozen=True)
class PointerTable:
    """Immutable snapshot; ``generation`` advances on every publish/unpublish."""

    generation: int
    entries: Mapping[int, PointerEntry]

    def resolve(self, handle: SlotHandle) -> PointerEntry:
        """The entry if ``handle`` is current in this snapshot, else :class:`StaleGeneration`."""
        entry = self.entries.get(handle.slot_id)
        if entry is None or entry.handle != handle:
            raise StaleGeneration(f"handle {handle} is not current "
                                  f"(table has {entry.handle if entry else None})",
                                  slot=handle.slot_id)
        return entry


class SlotState(enum.Enum):
    FREE = "free"
    STAGING = "staging"
    PUBLISHED = "published"
    RETIRING = "retiring"


class SlotTable:
    """``num_slots`` kernel slots with per-slot generations and the published snapshot."""

    def __init__(self, num_slots: int,
                 generations: Mapping[int, tuple[int, int]] | None = None) -> None:
        if num_slots < 0:
            raise IllegalTransition(f"num_slots must be >= 0, got {num_slots}")
        self.num_slots = num_slots
        self._state = [SlotState.FREE] * num_slots
        self._slot_gen = [0] * num_slots
        self._ptr_gen = [0] * num_slots
        for slot, (sg, pg) in (generations or {}).items():
            self._slot_gen[slot], self._ptr_gen[slot] = sg, pg
        self.table = PointerTable(0, MappingProxyType({}))

    def state(self, slot: int) -> SlotState:
        return self._state[slot]

    def generations(self, slot: int) -> tuple[int, int]:
        """``(slot_generation, pointer_generation)``."""
        return self._slot_gen[slot], self._ptr_gen[slot]

    def free_slots(self) -> list[int]:
        return [s for s in range(self.num_slots) if self._state[s] is SlotState.FREE]

    def reserve(self, slot: int | None = None) -> int:
        """FREE -> STAGING (slot generation + 1); the lowest free slot by default."""
        if slot is None:
            free = self.free_slots()
            if not free:
                raise IllegalTransition("no free adapter slot", reason="no_free_slot")
            slot = free[0]
        self._expect(slot, SlotState.FREE)
        self._state[slot] = SlotState.STAGING
        self._slot_gen[slot] += 1
        return slot

    def publish(self, slot: int, digest: str, residency_generation: int,
                pages: tuple[int, ...], plan: RowPlan, copy_event: CopyEvent,
                prepare: Callable[[PointerEntry], None] | None = None) -> SlotHandle:
        """STAGING -> PUBLISHED in one snapshot swap; refused before the copy event.

        ``prepare(entry)`` runs before the swap (e.g. writing the slot's kernel address
        tables: the slot is not in any snapshot yet, so no launch can read them).
        """
        self._expect(slot, SlotState.STAGING)
        if not copy_event.query():
            raise PublishBeforeCopy(f"slot {slot}: copy event not complete", slot=slot)
        handle = SlotHandle(slot, self._slot_gen[slot], self._ptr_gen[slot] + 1, digest)
        entry = PointerEntry(handle, residency_generation, pages, plan)
        if prepare is not None:
            prepare(entry)
        entries = dict(self.table.entries)
        entries[slot] = entry
        self._ptr_gen[slot] += 1
        self._state[slot] = SlotState.PUBLISHED
        self._swap(entries)
        return handle

    def discard(self, slot: int) -> None:
        """STAGING -> FREE with both generations bumped (failed load, never visible)."""
        self._expect(slot, SlotState.STAGING)
        self._bump_and_free(slot)

    def retire(self, slot: int) -> None:
        """PUBLISHED -> RETIRING: existing handles keep validating, no new binds."""
        self._expect(slot, SlotState.PUBLISHED)
        self._state[slot] = SlotState.RETIRING

    def reclaim(self, slot: int) -> None:
        """RETIRING -> FREE: entry unpublished in one swap, both generations bumped."""
        self._expect(slot, SlotState.RETIRING)
        entries = dict(self.table.entries)
        del entries[slot]
        self._swap(entries)
        self._bump_and_free(slot)

    def validate(self, handle: SlotHandle) -> PointerEntry:
        return self.table.resolve(handle)

    def _swap(self, entries: dict[int, PointerEntry]) -> None:
        self.table = PointerTable(self.table.generation + 1, MappingProxyType(entries))

    def _bump_and_free(self, slot: int) -> None:
        self._slot_gen[slot] += 1
        self._ptr_gen[slot] += 1
        self._state[slot] = SlotState.FREE

    def _expect(self, slot: int, state: SlotState) -> None:
        if not 0 <= slot < self.num_slots:
            raise IllegalTransition(f"slot {slot} outside [0, {self.num_slots})")
        if self._state[slot] is not state:
            raise IllegalTransition(f"slot {slot} is {self._state[slot].value}, "
                                    f"expected {state.value}", slot=slot)


@dataclass(frozen=True)
class LaunchSnapshot:
    """The self-consistent tuple a kernel launch reads."""

    launch_id: int
    table_generation: int
    entries: tuple[PointerEntry, ...]

    @property
    def generations(self) -> frozenset[tuple[str, int]]:
        return frozenset((e.key, e.residency_generation) for e in self.entries)


class LaunchRegistry:
    """Launches whose device work may still read adapter pages."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._open: dict[int, LaunchSnapshot] = {}
        self._ending: list[tuple[LaunchSnapshot, CopyEvent]] = []

    def begin(self, table: PointerTable, handles: Iterable[SlotHandle]) -> LaunchSnapshot:
        """Validate every handle against ``table`` (stale -> refused) and register."""
        entries = tuple(table.resolve(h) for h in handles)
        snap = LaunchSnapshot(next(self._ids), table.generation, entries)
        self._open[snap.launch_id] = snap
        return snap

    def end(self, snap: LaunchSnapshot, last_use: CopyEvent) -> None:
        """Host side done; the launch stays live until ``last_use`` completes."""
        if self._open.pop(snap.launch_id, None) is None:
            raise IllegalTransition(f"launch {snap.launch_id} is not open")
        self._ending.append((snap, last_use))

    def live_generations(self) -> frozenset[tuple[str, int]]:
        self._ending = [(s, e) for s, e in self._ending if not e.query()]
        live: set[tuple[str, int]] = set()
        for snap in (*self._open.values(), *(s for s, _ in self._ending)):
            live |= snap.generations
        return frozenset(live)
