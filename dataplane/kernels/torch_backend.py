"""Torch implementation of the LoRA backend (the CPU engine's path).

Per active slot: ``index_select`` the slot's rows, two ``mm`` per slice,
``index_add_`` into ``y`` (PEFT-style grouping, seed §0x02A). Factors come from
strided views of the storage when the table is stacked, else they are gathered
through the row-address tables. Reads slot counts and ranks on the host, so on
CUDA it syncs and is not graph-capturable: it is the CPU path and a second
oracle, the Triton backend is the GPU path.
"""

from __future__ import annotations

import torch

from dataplane.kernels.base import (
    LoraBackend,
    LoraBatchMeta,
    LoraMetaBuffers,
    LoraModuleWeights,
    LoraWorkspace,
    check_call,
)
from dataplane.kernels.errors import LoraShapeError


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


def _factor_rows(storage: torch.Tensor, homes: torch.Tensor, width: int) -> torch.Tensor:
    idx = homes[:, None] + torch.arange(width, device=homes.device, dtype=torch.int64)[None, :]
    return storage[idx]


class TorchLoraBackend(LoraBackend):
    """index_select / mm / index_add grouped by slot."""

    name = "torch"

    def build_meta(self, row_slot: torch.Tensor, buffers: LoraMetaBuffers) -> LoraBatchMeta:
        return build_meta_torch(row_slot, buffers)

    def workspace_numel(self, max_rows: int, max_slices: int, max_rank: int) -> int:
        return max_rows * max_slices * max_rank

    def _a(self, w: LoraModuleWeights, k: int, s: int, r: int) -> torch.Tensor:
        if w.stacked is not None:
            return w.stacked[k][0][s, :r]
        return _factor_rows(w.storage, w.a_rows[k, s, :r], w.in_features)

    def _bt(self, w: LoraModuleWeights, k: int, s: int, r: int) -> torch.Tensor:
        if w.stacked is not None:
            return w.stacked[k][1][s, :r]
        return _factor_rows(w.storage, w.b_rows[k, s, :r], w.out_features[k])

    def _groups(self, meta: LoraBatchMeta) -> list[tuple[int, torch.Tensor]]:
        counts = meta.slot_counts.tolist()
        starts = meta.slot_starts.tolist()
        rows = meta.sorted_rows.to(torch.int64)
        return [(s, rows[starts[s] : starts[s] + c]) for s, c in enumerate(counts) if c > 0]

    def shrink(
        self,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace,
    ) -> torch.Tensor:
        check_call(x, None, meta, weights)
        z = workspace.bottleneck(1, meta.num_rows, weights.num_slices, weights.max_rank)
        ranks = weights.ranks.tolist()
        for s, rows in self._groups(meta):
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
        ranks = weights.ranks.tolist()
        scales = weights.scales.tolist()
        offsets = weights.slice_offsets()
        zsum = z.sum(0) if z.shape[0] > 1 else z[0]
        for s, rows in self._groups(meta):
            for k, width in enumerate(weights.out_features):
                r = ranks[k][s]
                if r == 0:
                    continue
                zs = zsum.index_select(0, rows)[:, k, :r].to(y.dtype)
                d = torch.mm(zs, self._bt(weights, k, s, r)) * scales[k][s]
                y[:, offsets[k] : offsets[k] + width].index_add_(0, rows, d)
