"""Which resident adapters a model's LoRA fold holds: fold slots, filled on demand.

A fold's GEMM (dataplane/layers/lora_fold_store.py) reads the ``A`` of every fold slot on
every step, whether a row uses it or not. Holding every resident slot would make a step
with 128 resident adapters read 128 adapters' ``A`` even when 64 rows can use at most 64.
So a fold holds ``F = min(resident slots, rows a folded step may have)`` fold slots, and
`FoldSlots` maps table slots to them, least recently used first out:

* `rows` gives a step's rows their fold slots. A slot the fold does not hold yet is copied
  in from every attached factor source into a fold slot that no row of this step uses —
  first the empty ones, then the least recently used. On CUDA all of a step's copies go in
  one launch (dataplane/ops/triton/copy_jobs.py over the sources' `fold_jobs`), elsewhere
  as torch copies (`copy_to_fold`). A source is a stacked factor table
  (`StackedFoldSource`) or the agent's unified pool's pages (dataplane/pool/fold_source.py).
  The copies are queued on the stream before the step, so a step already in flight still
  reads what it was given.
* A stacked table's later writes and clears reach the fold slot holding its slot through
  the table's mirror (`LoraFactorTable.mirror`); the pool empties the fold slot of a slot
  it publishes anew or reclaims (`forget`). Either way a fold slot always equals its slot.
* Fold width. Few live adapters per step (a popular few serving most requests) should not
  pay for reading ``F`` slots' ``A``. Holdings stay below a capacity, one of `widths`
  (multiples of `width_unit`, up to ``F``): it grows to the next width when a step brings
  more distinct adapters, and shrinks to what the last `SHRINK_WINDOW` steps needed (the
  adapters held above it are dropped; live ones are copied in again below it). Each step's
  GEMMs read only `step_width` fold slots, the width above its highest fold slot (one
  decode graph per batch size and width, dataplane/engine/cuda_graphs.py).

Every TP rank sees the same plans in the same order, so every rank makes the same choices.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from dataplane.h2d import to_device
from dataplane.intmath import cdiv
from dataplane.kernels.errors import LoraShapeError, LoraSlotError
from dataplane.kernels.factor_table import LoraFactorTable
from dataplane.layers.lora_fold_store import FoldStore

SHRINK_WINDOW = 64
"""Steps whose distinct adapters the fold's capacity must still hold before it shrinks."""


def default_width_unit(fold_slots: int) -> int:
    """At most four fold widths (each one more decode graph per batch size), none under
    16 slots."""
    return max(16, cdiv(fold_slots, 4))


class FoldSlots:
    """Table slot -> fold slot for every (factor table, fold store) pair of one model."""

    def __init__(self, table_slots: int, fold_slots: int, batched: bool | None = None,
                 width_unit: int | None = None) -> None:
        if not 0 < fold_slots <= table_slots:
            raise LoraShapeError(f"{fold_slots} fold slots for {table_slots} table slots")
        unit = width_unit or default_width_unit(fold_slots)
        if unit <= 0:
            raise LoraShapeError(f"fold width unit {unit} is not positive")
        self.table_slots, self.fold_slots = table_slots, fold_slots
        self.widths = tuple(sorted({min(k * unit, fold_slots)
                                    for k in range(1, cdiv(fold_slots, unit) + 1)}))
        """The fold widths a step may read (module docstring), the last one `fold_slots`."""
        self.capacity = self.widths[0]
        """Every holding sits below it (one of `widths`)."""
        self.step_width = self.widths[0]
        """Fold slots the last `rows` step's GEMMs read: the width above its fold slots."""
        self._demand: deque[int] = deque(maxlen=SHRINK_WINDOW)
        self.width_steps = dict.fromkeys(self.widths, 0)
        """Host-side count of `rows` steps per `step_width`."""
        self.batched = batched
        """Copy adapters in with one batched launch (`copy_jobs`) instead of torch copies
        per projection; None: on CUDA. Off where a block is not whole 4-byte words."""
        self._base: torch.Tensor | None = None
        self._where: dict[int, int] = {}
        """table slot -> the fold slot holding it"""
        self._holder = [-1] * fold_slots
        self._recent: OrderedDict[int, None] = OrderedDict.fromkeys(range(fold_slots))
        """fold slots, least recently used first (never-used ones stay in front)"""
        self._pairs: list[FoldSource] = []
        self.copied = 0
        """Host-side count of table slots copied into the fold (misses)."""

    def attach(self, table: LoraFactorTable, store: FoldStore) -> None:
        """Keep `store` (`fold_slots` slots) filled from the stacked `table` (`table_slots`
        slots), its later writes and clears mirrored into the fold slot holding theirs."""
        if table.weights.stacked is None:
            raise LoraShapeError("a fold copies from a stacked table")
        self.attach_source(StackedFoldSource(table, store))
        table.mirror = _FoldMirror(self, store)

    def attach_source(self, source: FoldSource) -> None:
        """Keep `source.store` filled from `source`. A source that is not a mirrored table
        (the unified pool's pages) must call `forget` whenever one of its slots changes."""
        store = source.store
        if source.num_slots != self.table_slots or store.hot_slots != self.fold_slots:
            raise LoraShapeError("the table or the fold store has another slot count")
        if source.out_features != store.widths:
            raise LoraShapeError("a fold copies from a table of the same slices")
        if source.max_rank > store.rank:
            raise LoraShapeError("the table's rank exceeds the fold's")
        if self._pairs and store.weight_aug.device != self._pairs[0].store.weight_aug.device:
            raise LoraShapeError("one model's folds live on one device")
        if source.dtype != store.weight_aug.dtype:
            raise LoraShapeError("the table and the fold hold other dtypes")
        self._pairs.append(source)
        if self.batched is None:
            self.batched = store.weight_aug.device.type == "cuda"
        if self._base is None:
            self._base = torch.zeros(1, dtype=torch.int32, device=store.weight_aug.device)
        self.batched = self.batched and source.word_aligned()

    def forget(self, table_slot: int) -> None:
        """`table_slot` changed (published anew, or reclaimed): the fold slot holding it
        becomes empty, and a later step using it copies it in again."""
        held = self._where.pop(table_slot, None)
        if held is not None:
            self._holder[held] = -1

    @property
    def resident_bytes(self) -> int:
        """Device bytes of the fold's own copies (every attached store's `A` rows below the
        base weight, its `B` and scales): memory beyond the factors' home."""
        return sum(source.store.nbytes for source in self._pairs)

    def holder(self, table_slot: int) -> int:
        """The fold slot holding `table_slot`, or -1."""
        return self._where.get(table_slot, -1)

    def width_for(self, slots: int) -> int:
        """The smallest fold width of at least `slots` slots."""
        return next(w for w in self.widths if w >= slots)

    def rows(self, row_slot: Sequence[int]) -> list[int]:
        """Each row's fold slot (-1 stays -1), after copying in the slots the fold lacks;
        sets `step_width`."""
        live = dict.fromkeys(s for s in row_slot if s >= 0)
        if len(live) > self.fold_slots:
            raise LoraSlotError(f"a folded step uses {len(live)} adapters, the fold holds "
                                f"{self.fold_slots}")
        if live and max(live) >= self.table_slots:
            raise LoraSlotError(f"slot {max(live)} outside [0, {self.table_slots})")
        self._demand.append(len(live))
        self._resize(self.width_for(max(self._demand)))
        missing = [s for s in live if s not in self._where]
        if missing:
            used = {self._where[s] for s in live if s in self._where}
            free = sorted((f for f in self._recent if f < self.capacity and f not in used),
                          key=lambda f: self._holder[f] >= 0)[:len(missing)]  # empty first
            for slot, f in zip(missing, free, strict=True):
                self._where.pop(self._holder[f], None)
                self._where[slot], self._holder[f] = f, slot
            self._copy_in(missing, free)
            self.copied += len(missing)
        for s in live:
            self._recent.move_to_end(self._where[s])
        out = [self._where[s] if s >= 0 else -1 for s in row_slot]
        self.step_width = self.width_for(max(out, default=-1) + 1)
        self.width_steps[self.step_width] += 1
        return out

    def _resize(self, capacity: int) -> None:
        """Grow to `capacity` (empty slots above), or shrink to it: holdings at or above
        it are dropped (their fold slots become empty; a live one is copied in again)."""
        for f in range(capacity, self.capacity):
            self._where.pop(self._holder[f], None)
            self._holder[f] = -1
        self.capacity = capacity

    def _copy_in(self, table_slots: list[int], fold_slots: list[int]) -> None:
        """Every source's fold slots <- its slots, in one launch when batched."""
        if not self._pairs or self._base is None:
            return
        if not self.batched:
            for source in self._pairs:
                source.copy_to_fold(table_slots, fold_slots)
            return
        from dataplane.ops.triton.copy_jobs import copy_jobs  # Triton only when batched

        s = np.array(table_slots, dtype=np.int64)
        f = np.array(fold_slots, dtype=np.int64)
        jobs = np.concatenate([source.fold_jobs(s, f) for source in self._pairs])
        jobs[:, :2] -= self._base.data_ptr()
        host = torch.from_numpy(jobs // 4)
        dev = self._base.device
        copy_jobs(self._base, host.pin_memory().to(dev, non_blocking=True)
                  if dev.type == "cuda" else host)


class FoldSource(Protocol):
    """What a fold store copies a table slot's factors from: a stacked factor table
    (`StackedFoldSource`) or the unified pool's pages (dataplane/pool/fold_source.py)."""

    store: FoldStore
    num_slots: int
    max_rank: int
    out_features: tuple[int, ...]
    dtype: torch.dtype

    def word_aligned(self) -> bool:
        """Every copy's addresses and length are whole 4-byte words (`copy_jobs` can run)."""
        ...

    def fold_jobs(self, table_slots: np.ndarray, fold_slots: np.ndarray) -> np.ndarray:
        """int64 ``[J, 3]`` (source address, destination address, bytes): the copies that
        make each fold slot equal its table slot (rows past the slot's rank zero)."""
        ...

    def copy_to_fold(self, table_slots: list[int], fold_slots: list[int]) -> None:
        """The same copies as torch ops, on the store's device."""
        ...


class StackedFoldSource:
    """A stacked `LoraFactorTable`: each slot's blocks sit at a fixed stride."""

    def __init__(self, table: LoraFactorTable, store: FoldStore) -> None:
        self.table, self.store = table, store
        self.num_slots, self.max_rank = table.num_slots, table.max_rank
        self.out_features, self.dtype = table.out_features, table.dtype
        self._ranges = store.copy_ranges(table)

    def word_aligned(self) -> bool:
        return not (self._ranges % 4).any()

    def fold_jobs(self, table_slots: np.ndarray, fold_slots: np.ndarray) -> np.ndarray:
        r, s, f = self._ranges, table_slots[:, None], fold_slots[:, None]
        return np.stack([r[:, 0] + s * r[:, 1], r[:, 2] + f * r[:, 3],
                         np.broadcast_to(r[:, 4], (len(table_slots), len(r)))],
                        axis=-1).reshape(-1, 3)

    def copy_to_fold(self, table_slots: list[int], fold_slots: list[int]) -> None:
        dev = self.store.weight_aug.device
        self.store.copy_in(self.table, to_device(table_slots, torch.int64, dev),
                           to_device(fold_slots, torch.int64, dev))


class _FoldMirror:
    """A table's `SlotMirror`: its writes and clears reach the fold slot holding the slot."""

    def __init__(self, slots: FoldSlots, store: FoldStore) -> None:
        self.slots, self.store = slots, store

    def write(self, slot: int,
              factors: Mapping[int, tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        held = self.slots.holder(slot)
        if held >= 0:
            self.store.write(held, factors)

    def clear(self, slot: int) -> None:
        held = self.slots.holder(slot)
        if held >= 0:
            self.store.clear(held)
