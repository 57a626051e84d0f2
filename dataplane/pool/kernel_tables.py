"""The kernels' per-slot row-address tables, written from page placement at publication.

``dataplane.kernels.base.LoraModuleWeights`` wants, per (layer, fused module): the pool
viewed flat (``storage``), int64 ``a_rows`` / ``b_rows`` ``[NS, S, R]`` element offsets of
every rank row, int32 ``ranks`` and float32 ``scales`` ``[NS, S]``. :class:`KernelTables`
allocates those tensors once, over the pool's own storage (no per-step copies, no
packed duplicate of the factors), and rewrites one slot's column when that slot is
published (before the pointer-table swap, while no launch can name the slot) or
reclaimed (rank 0 = exact zero delta). Register it as a
:class:`~dataplane.pool.device_pool.SlotListener` of the :class:`DevicePool`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dataplane.kernels.base import LoraModuleWeights
from dataplane.kernels.factor_table import power_of_two_divisor
from dataplane.pool.errors import LayoutError
from dataplane.pool.packing import row_offsets
from dataplane.pool.page_demand import ModuleRows
from dataplane.pool.page_storage import PageStorage
from dataplane.pool.slot_table import PointerEntry


@dataclass(frozen=True)
class ModuleGroup:
    """One kernel call site: ``slices`` are the adapter module names fused into it,
    e.g. ``("q_proj", "k_proj", "v_proj")`` with ``out_features`` their widths."""

    layer: int
    name: str
    slices: tuple[str, ...]
    in_features: int
    out_features: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.slices) != len(self.out_features) or not self.slices:
            raise LayoutError(f"{self.name}: slices and out_features disagree")


class KernelTables:
    """Address tables for every module group over ``num_slots`` slots."""

    def __init__(self, storage: PageStorage, groups: Sequence[ModuleGroup], num_slots: int,
                 max_rank: int) -> None:
        self.storage = storage
        self.max_rank = max_rank
        self.groups = {(g.layer, g.name): g for g in groups}
        dev = storage.device
        # One tensor per field for all groups (each group's tables are views of it), so a
        # publication rewrites one slot's column with 4 copies instead of ~4 per module.
        self._base: dict[tuple[int, str], int] = {}
        total = 0
        for key, g in self.groups.items():
            self._base[key] = total
            total += len(g.slices)
        self._a = torch.zeros(total, num_slots, max_rank, dtype=torch.int64, device=dev)
        self._b = torch.zeros(total, num_slots, max_rank, dtype=torch.int64, device=dev)
        self._ranks = torch.zeros(total, num_slots, dtype=torch.int32, device=dev)
        self._scales = torch.zeros(total, num_slots, dtype=torch.float32, device=dev)
        self.host_a = np.zeros((total, num_slots, max_rank), dtype=np.int64)
        self.host_b = np.zeros((total, num_slots, max_rank), dtype=np.int64)
        self.host_rows = np.zeros((total, num_slots), dtype=np.int64)
        """Host copies of the published row offsets, and each slice's number of rank rows
        (physical rank; 0: slice absent): what a LoRA fold copies from
        (dataplane/pool/fold_source.py)."""
        self.slot_versions = np.zeros(num_slots, dtype=np.int64)
        """Bumped on every publication or reclaim of a slot (every group's
        `LoraModuleWeights.slot_versions` is this array)."""
        self._weights: dict[tuple[int, str], LoraModuleWeights] = {}
        # Every rank row starts at page * page_elems + the widths of the rows before it in
        # its page (dataplane/pool/page_demand.py, plan_rows), and only rows of these
        # groups' widths are published: their gcd with the page size divides every address,
        # so the kernels may use wide vector loads as on stacked tables.
        align = power_of_two_divisor(math.gcd(storage.geometry.page_elems, *(
            w for g in self.groups.values() for w in (g.in_features, *g.out_features))), 16)
        self.addr_align = align
        for key, g in self.groups.items():
            lo, hi = self._base[key], self._base[key] + len(g.slices)
            self._weights[key] = LoraModuleWeights(
                storage=storage.flat,
                a_rows=self._a[lo:hi],
                b_rows=self._b[lo:hi],
                ranks=self._ranks[lo:hi],
                scales=self._scales[lo:hi],
                in_features=g.in_features,
                out_features=g.out_features,
                max_rank=max_rank,
                addr_align=align,
                slot_versions=self.slot_versions,
            )

    def weights(self, layer: int, name: str) -> LoraModuleWeights:
        return self._weights[(layer, name)]

    def slice_range(self, layer: int, name: str) -> tuple[int, int]:
        """[lo, hi): the group's slices' rows in the tables (host and device alike)."""
        lo = self._base[(layer, name)]
        return lo, lo + len(self.groups[(layer, name)].slices)

    @property
    def scales(self) -> torch.Tensor:
        """float32 ``[slices of every group, S]`` on the device, as published."""
        return self._scales

    def _rows(self, entry: PointerEntry) -> dict[tuple[int, str], list[ModuleRows | None]]:
        """Validate the whole entry against every group before writing anything."""
        found: dict[tuple[int, str], list[ModuleRows | None]] = {}
        known = {(m.shape.layer, m.shape.module) for m in entry.plan.modules}
        placed = set()
        for key, g in self.groups.items():
            rows: list[ModuleRows | None] = []
            for k, module in enumerate(g.slices):
                if (g.layer, module) not in known:
                    rows.append(None)
                    continue
                m = entry.plan.module(g.layer, module)
                s = m.shape
                if s.d_in != g.in_features or s.d_out != g.out_features[k]:
                    raise LayoutError(f"{s.key}: [{s.d_out}x{s.d_in}] does not fit group "
                                      f"{g.name} slice {k}")
                if s.physical_rank > self.max_rank:
                    raise LayoutError(f"{s.key}: physical rank {s.physical_rank} > table "
                                      f"max rank {self.max_rank}")
                placed.add(s.key)
                rows.append(m)
            found[key] = rows
        missing = known - placed
        if missing:
            raise LayoutError(f"adapter modules with no kernel call site: {sorted(missing)}")
        return found

    def on_publish(self, entry: PointerEntry) -> None:
        """Rewrite `entry`'s slot column of every table: built on the host, then one copy
        per field (stream-ordered before any later launch)."""
        slot = entry.handle.slot_id
        elems = self.storage.geometry.page_elems
        total = self._ranks.shape[0]
        a_col = torch.zeros(total, self.max_rank, dtype=torch.int64)
        b_col = torch.zeros(total, self.max_rank, dtype=torch.int64)
        ranks = torch.zeros(total, dtype=torch.int32)
        scales = torch.zeros(total, dtype=torch.float32)
        rows_n = np.zeros(total, dtype=np.int64)
        for key, rows in self._rows(entry).items():
            base = self._base[key]
            for k, m in enumerate(rows):
                if m is None:
                    continue
                a_off, b_off = row_offsets(m, entry.pages, elems)
                n = len(a_off)
                a_col[base + k, :n] = torch.tensor(a_off, dtype=torch.int64)
                b_col[base + k, :n] = torch.tensor(b_off, dtype=torch.int64)
                ranks[base + k] = m.shape.rank
                rows_n[base + k] = n
                scales[base + k] = float(m.shape.scale)
        self.slot_versions[slot] += 1
        self.host_a[:, slot], self.host_b[:, slot] = a_col.numpy(), b_col.numpy()
        self.host_rows[:, slot] = rows_n
        pinned = self._a.device.type == "cuda"
        for dst, src in ((self._a, a_col), (self._b, b_col), (self._ranks, ranks),
                         (self._scales, scales)):
            dst[:, slot].copy_(src.pin_memory() if pinned else src, non_blocking=pinned)

    def on_unpublish(self, slot: int) -> None:
        self.slot_versions[slot] += 1
        self.host_a[:, slot] = self.host_b[:, slot] = self.host_rows[:, slot] = 0
        self._ranks[:, slot] = 0
        self._scales[:, slot] = 0.0
        self._a[:, slot] = 0
        self._b[:, slot] = 0
