"""Torch implementation of the LoRA backend (the CPU engine's path).

Two paths, same contract (:class:`dataplane.kernels.base.LoraBackend`):

* **loop** — per active slot: ``index_select`` the slot's rows, two ``mm`` per
  slice, ``index_add_`` into ``y`` (PEFT-style grouping). Factors
  come from strided views of the storage when the table is stacked, else they
  are gathered through the row-address tables. Host work grows with the number
  of active slots; each factor is read once per step.
* **batched** — per slice, for all active rows at once: gather the live rank
  rows (``i < ranks[k, s]``) of every active slot's ``A`` / ``Bt`` once into
  ``[L, d]`` (``L`` = sum of the active slots' ranks, through the stacked view
  or the row-address tables), one ``mm`` of all active rows against all of
  them, and keep each row's own block (``gather``); expand scatters each row's
  ``z`` into its slot's block of a zero ``[n, L]`` bottleneck and does one
  ``mm`` with the ``Bt`` rows. Host work is a few ops per slice whatever the
  slot count; the price is ``n · L · d`` multiply-adds instead of
  ``n · r · d`` (every row meets every active slot). Only live rank rows are
  ever read, so whatever the storage holds past a slot's rank (stale pages,
  NaN) is never used; ``z`` past a row's rank is zero, rows whose slice has
  rank 0 are not written, rows with slot ``-1`` are not touched. The index
  tensors depend only on (rows per slot, ranks): they are cached per backend,
  so all layers of a step share them.

* **grouped** (kernels/torch_grouped.py) — ``add_lora`` only, over tables that
  carry ``slot_versions`` (the unified pool's, stacked tables): each slot's factors
  stacked once per publication (every slice's ``A`` in one matrix, ``Bt``
  block-diagonal over the slices), then per projection the step's slots in one padded
  shrink ``bmm`` and one expand ``bmm`` (when padding them to the largest slot's rows
  costs at most a quarter more rows; else the slots with at most
  :data:`GROUPED_MAX_ROWS_PER_SLOT` rows in one such pair and each heavier slot in its
  own). A projection is then ~6 ops for every slot together and reads every factor in
  place, where the batched path gathers every active factor per call and multiplies
  every row with every slot, and the loop path runs ~5 ops per slot and slice. This is
  what ``"auto"`` runs in ``add_lora`` when the tables carry versions (the engine's
  case); the rule below covers the rest.

Rule (``path="auto"``, the default, and always for ``shrink`` / ``expand``), per step:
slots with at most
:data:`BATCHED_MAX_ROWS_PER_SLOT` rows (decode rows: each loop iteration would
do little work for its fixed host cost) go through the batched path, provided
there are at least two of them; the other slots (prefill chunks, where the
``L / r`` wasted products would dominate) go through the loop. A mixed step
(one prefill chunk plus decode rows) uses both, on disjoint rows.
``path="loop"`` / ``"batched"`` / ``"grouped"`` force one path for every slot (tests,
benches; ``"grouped"`` falls back to ``"auto"`` over tables without versions).
Shrink and expand split from the same metadata, so they agree.

Reads slot counts and ranks on the host, so on CUDA it syncs and is not
graph-capturable: it is the CPU path and a second oracle, the Triton backend
is the GPU path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.kernels.base import (
    LoraBackend,
    LoraBatchMeta,
    LoraMetaBuffers,
    LoraModuleWeights,
    LoraWorkspace,
    check_call,
    gather_rank_rows,
)
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.torch_grouped import GroupPlan, SlotFactorCache, group_plans

BATCHED_MAX_ROWS_PER_SLOT = 4
"""``path="auto"`` uses the batched path while active rows <= this × active slots."""
GROUPED_MAX_ROWS_PER_SLOT = 16
"""When a step's slots are too uneven to share one padded group, the grouped path pads
the slots with at most this many rows (decode rows) into one group and gives each
heavier slot (a prefill chunk) a group of its own, unpadded."""

TORCH_PATHS = ("auto", "loop", "batched", "grouped")
_BLOCK_CACHE_SIZE = 256


def build_meta_torch(row_slot: torch.Tensor, buffers: LoraMetaBuffers) -> LoraBatchMeta:
    """Stable sort of rows by slot (``-1`` rows last) with torch ops."""
    if row_slot.dim() != 1:
        raise LoraShapeError(f"row_slot must be 1-D, got {list(row_slot.shape)}")
    meta = buffers.views(row_slot.shape[0])
    s = buffers.num_slots
    meta.row_slot.copy_(row_slot)
    key = torch.where(meta.row_slot < 0, s, meta.row_slot.to(torch.int64))
    order = torch.sort(key, stable=True).indices
    meta.sorted_rows.copy_(order)
    counts = torch.bincount(key, minlength=s + 1)[:s]
    meta.slot_counts.copy_(counts)
    meta.slot_starts.copy_(torch.cumsum(counts, 0) - counts)
    return meta


@dataclass(frozen=True)
class _ActiveRows:
    """The step's rows that have a slot, in slot order (host lists + device tensors)."""

    counts: list[int]  # [S] rows per slot
    slots_on: list[int]  # [U] slots with at least one row, ascending
    rows: torch.Tensor  # int64 [n] scheduler rows, grouped by slot
    slots: torch.Tensor  # int64 [n] slot of each of them


@dataclass(frozen=True)
class _SliceBlocks:
    """One slice's live rank rows of the active slots, for the batched path.

    The live rank rows (``i < ranks[k, s]``) of all active slots are
    concatenated slot by slot: ``L = sum of their ranks`` rows, slot ``u``'s
    block at ``off[u]``. Row ``t`` (slot index ``u``) owns columns
    ``cols[t, i] = off[u] + i`` of an ``[n, L]`` product for ``i < r_u``.
    """

    rank: int  # Rp: largest rank of the slice among active slots (> 0)
    flat: torch.Tensor  # int64 [L] index (slot * R + i) of each live rank row
    cols: torch.Tensor  # int64 [n, Rp] own columns of each active row (0 where dead)
    live: torch.Tensor | None  # bool [n, Rp] i < rank of the row; None = all live
    keep: torch.Tensor | None  # int64 [m] row positions with rank > 0; None = all


@dataclass(frozen=True)
class _Grouping:
    """One step's rows for the grouped path: its padded plans (`group_plans`) and the
    slot range whose cached factors must be current."""

    plans: list[GroupPlan]
    slots: range


class TorchLoraBackend(LoraBackend):
    """Torch LoRA branch: per-slot loop or one batched mm per slice (module docstring)."""

    name = "torch"

    def __init__(self, path: str = "auto") -> None:
        if path not in TORCH_PATHS:
            raise LoraShapeError(f"unknown torch LoRA path {path!r}, want one of {TORCH_PATHS}")
        self.path = path
        self._block_cache: dict[tuple[object, ...], _SliceBlocks] = {}
        self._factor_caches: dict[int, tuple[LoraModuleWeights, SlotFactorCache]] = {}
        self._grouping: tuple[LoraBatchMeta, _Grouping] | None = None

    def build_meta(self, row_slot: torch.Tensor, buffers: LoraMetaBuffers) -> LoraBatchMeta:
        return build_meta_torch(row_slot, buffers)

    def workspace_numel(self, max_rows: int, max_slices: int, max_rank: int) -> int:
        return max_rows * max_slices * max_rank

    def batched_slots(self, meta: LoraBatchMeta) -> list[int]:
        """Slots this step's shrink/expand handle on the batched path (the rest loop)."""
        return self._light(meta.slot_counts.tolist())

    def _light(self, counts: list[int]) -> list[int]:
        on = [s for s, c in enumerate(counts) if c > 0]
        if self.path != "auto":
            return on if self.path == "batched" else []
        light = [s for s in on if counts[s] <= BATCHED_MAX_ROWS_PER_SLOT]
        return light if len(light) >= 2 else []

    def _active(self, meta: LoraBatchMeta) -> _ActiveRows:
        counts = meta.slot_counts.tolist()
        rows = meta.sorted_rows[: sum(counts)].to(torch.int64)
        slots = meta.row_slot.index_select(0, rows).to(torch.int64)
        return _ActiveRows(counts, [s for s, c in enumerate(counts) if c > 0], rows, slots)

    # -- loop path -----------------------------------------------------------

    def _a(self, w: LoraModuleWeights, k: int, s: int, r: int) -> torch.Tensor:
        if w.stacked is not None:
            return w.stacked[k][0][s, :r]
        return gather_rank_rows(w.storage, w.a_rows[k, s, :r], w.in_features)

    def _bt(self, w: LoraModuleWeights, k: int, s: int, r: int) -> torch.Tensor:
        if w.stacked is not None:
            return w.stacked[k][1][s, :r]
        return gather_rank_rows(w.storage, w.b_rows[k, s, :r], w.out_features[k])

    def _split(self, act: _ActiveRows) -> tuple[list[tuple[int, torch.Tensor]], _ActiveRows | None]:
        """(loop groups ``(slot, rows)``, active rows of the batched slots or None)."""
        light = set(self._light(act.counts))
        loop: list[tuple[int, torch.Tensor]] = []
        parts: list[tuple[int, torch.Tensor]] = []
        start = 0
        for s, c in enumerate(act.counts):
            if c > 0:
                (parts if s in light else loop).append((s, act.rows[start : start + c]))
            start += c
        if not parts:
            return loop, None
        if not loop:
            return loop, act
        counts = [c if s in light else 0 for s, c in enumerate(act.counts)]
        rows = torch.cat([r for _, r in parts])
        slots = torch.cat([torch.full_like(r, s) for s, r in parts])
        return loop, _ActiveRows(counts, [s for s, _ in parts], rows, slots)

    # -- batched path --------------------------------------------------------

    def _blocks(
        self, act: _ActiveRows, ranks: list[list[int]], k: int, max_rank: int
    ) -> _SliceBlocks | None:
        on = [ranks[k][s] for s in act.slots_on]
        if max(on) == 0:
            return None
        # Every layer of a step (and steps with the same rows per slot) share
        # the index tensors: build them once per distinct key.
        key = (tuple(act.counts), tuple(on), max_rank, str(act.rows.device))
        hit = self._block_cache.get(key)
        if hit is None:
            if len(self._block_cache) >= _BLOCK_CACHE_SIZE:
                self._block_cache.clear()
            hit = self._block_cache[key] = self._build_blocks(act, on, max_rank)
        return hit

    def _build_blocks(self, act: _ActiveRows, on: list[int], max_rank: int) -> _SliceBlocks:
        rank = max(on)
        flat: list[int] = []
        cols: list[list[int]] = []
        off = 0
        for s, r in zip(act.slots_on, on, strict=True):
            flat.extend(range(s * max_rank, s * max_rank + r))
            cols.append([off + i if i < r else 0 for i in range(rank)])
            off += r
        device = act.rows.device
        u = torch.repeat_interleave(
            torch.arange(len(on)), torch.tensor([act.counts[s] for s in act.slots_on])
        )
        row_cols = torch.tensor(cols, dtype=torch.int64).index_select(0, u)
        live = keep = None
        if min(on) < rank:
            row_rank = torch.tensor(on).index_select(0, u)
            live = (torch.arange(rank)[None, :] < row_rank[:, None]).to(device)
            if min(on) == 0:
                keep = torch.nonzero(row_rank > 0).flatten().to(device)
        return _SliceBlocks(
            rank, torch.tensor(flat, dtype=torch.int64, device=device), row_cols.to(device),
            live, keep,
        )  # fmt: skip

    def _factors(self, w: LoraModuleWeights, k: int, which: int, bl: _SliceBlocks) -> torch.Tensor:
        """Live rank rows of ``A`` (``which=0``) or ``Bt`` (1), ``[L, d]``."""
        width = w.in_features if which == 0 else w.out_features[k]
        if w.stacked is not None:
            return w.stacked[k][which].flatten(0, 1).index_select(0, bl.flat)
        table = w.a_rows if which == 0 else w.b_rows
        homes = table[k].flatten().index_select(0, bl.flat)
        return gather_rank_rows(w.storage, homes, width)

    def _shrink_batched(
        self, x: torch.Tensor, z: torch.Tensor, act: _ActiveRows, w: LoraModuleWeights
    ) -> None:
        ranks = w.ranks.tolist()
        xs = x.index_select(0, act.rows)  # [n, d_in]
        for k in range(w.num_slices):
            bl = self._blocks(act, ranks, k, w.max_rank)
            if bl is None:
                continue
            # Every row against every active slot's A in one mm; keep the own block.
            zk = torch.mm(xs, self._factors(w, k, 0, bl).t()).gather(1, bl.cols).float()
            if bl.live is not None:
                zk = torch.where(bl.live, zk, 0.0)
            z[0, :, k, : bl.rank].index_copy_(0, act.rows, zk)

    def _expand_batched(
        self, y: torch.Tensor, zsum: torch.Tensor, act: _ActiveRows, w: LoraModuleWeights
    ) -> None:
        ranks = w.ranks.tolist()
        offsets = w.slice_offsets()
        zrows = zsum.index_select(0, act.rows)  # [n, NS, R]
        for k, width in enumerate(w.out_features):
            bl = self._blocks(act, ranks, k, w.max_rank)
            if bl is None:
                continue
            zk = zrows[:, k, : bl.rank]
            if bl.live is not None:
                zk = torch.where(bl.live, zk, 0.0)  # dead entries add 0 to column 0
            bt = self._factors(w, k, 1, bl)  # [L, w_k]
            # Block-diagonal bottleneck: each row's z sits in its slot's block.
            zb = torch.zeros(zk.shape[0], bt.shape[0], dtype=y.dtype, device=y.device)
            zb.scatter_add_(1, bl.cols, zk.to(y.dtype))
            d = torch.mm(zb, bt)
            scale = w.scales[k].index_select(0, act.slots)
            d = (d * scale[:, None]).to(y.dtype)
            rows = act.rows
            if bl.keep is not None:
                rows, d = rows.index_select(0, bl.keep), d.index_select(0, bl.keep)
            y[:, offsets[k] : offsets[k] + width].index_add_(0, rows, d)

    # -- grouped path (kernels/torch_grouped.py) -----------------------------

    def add_lora(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace | None = None,
    ) -> None:
        if weights.slot_versions is None or self.path in ("loop", "batched"):
            super().add_lora(y, x, meta, weights, workspace)
            return
        check_call(x, y, meta, weights)
        step = self._step_grouping(meta)
        if not step.plans:
            return
        cache = self._factor_cache(weights)
        cache.refresh(weights, step.slots)
        for plan in step.plans:
            cache.add(y, x, plan)

    def _factor_cache(self, weights: LoraModuleWeights) -> SlotFactorCache:
        """The projection's stacked factors (the entry keeps `weights` alive, so its id
        is not reused while cached)."""
        hit = self._factor_caches.get(id(weights))
        if hit is None:
            hit = self._factor_caches[id(weights)] = (weights, SlotFactorCache(weights))
        return hit[1]

    def _step_grouping(self, meta: LoraBatchMeta) -> _Grouping:
        """The step's grouping, built by its first projection and shared by the rest."""
        if self._grouping is not None and self._grouping[0] is meta:
            return self._grouping[1]
        act = self._active(meta)
        on = act.slots_on
        light = meta.num_rows if self.path == "grouped" else GROUPED_MAX_ROWS_PER_SLOT
        plans = group_plans(act.counts, act.rows, light) if on else []
        grouping = _Grouping(plans, range(on[0], on[-1] + 1) if on else range(0))
        self._grouping = (meta, grouping)
        return grouping

    # -- contract ------------------------------------------------------------

    def shrink(
        self,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace,
    ) -> torch.Tensor:
        check_call(x, None, meta, weights)
        z = workspace.bottleneck(1, meta.num_rows, weights.num_slices, weights.max_rank)
        act = self._active(meta)
        if not act.slots_on:
            return z
        loop, light = self._split(act)
        if light is not None:
            self._shrink_batched(x, z, light, weights)
        ranks = weights.ranks.tolist()
        for s, rows in loop:
            xs = x.index_select(0, rows)
            for k in range(weights.num_slices):
                r = ranks[k][s]
                if r == 0:
                    continue
                zs = torch.mm(xs, self._a(weights, k, s, r).t()).float()
                z[0, :, k, :r].index_copy_(0, rows, zs)
        return z

    def expand(
        self,
        y: torch.Tensor,
        z: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
    ) -> None:
        check_call(None, y, meta, weights)
        act = self._active(meta)
        if not act.slots_on:
            return
        zsum = z.sum(0) if z.shape[0] > 1 else z[0]
        loop, light = self._split(act)
        if light is not None:
            self._expand_batched(y, zsum, light, weights)
        ranks = weights.ranks.tolist()
        scales = weights.scales.tolist()
        offsets = weights.slice_offsets()
        for s, rows in loop:
            for k, width in enumerate(weights.out_features):
                r = ranks[k][s]
                if r == 0:
                    continue
                zs = zsum.index_select(0, rows)[:, k, :r].to(y.dtype)
                d = torch.mm(zs, self._bt(weights, k, s, r)) * scales[k][s]
                y[:, offsets[k] : offsets[k] + width].index_add_(0, rows, d)
