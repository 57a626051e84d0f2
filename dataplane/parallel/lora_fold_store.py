"""One parallel projection's hot-slot LoRA fold (dataplane/ops/lora_fold.py) on one rank.

The projection's base weight becomes the top rows of ``weight_aug`` ``[N + H*C, d_in]``;
below it, slot ``s < H`` holds each slice's local ``A`` (zero-padded to R rows, the power
of two at or above the largest rank), so one GEMM gives ``[y | z]`` and the shrink costs
the GEMM ``H*C`` more output columns instead of a launch. ``b[k]`` ``[H, R, w_k]`` holds
slice k's local ``B`` (transposed) and ``scale`` ``[H, slices]`` the scales: what the
projection's consumer needs to add each row's expand.

The default layout (no_extra_collectives) only: column-parallel ``A`` replicated and ``B``
output-sharded; row-parallel ``A`` input-sharded and ``B`` replicated, ``z`` a partial sum
that the base all-reduce completes with ``y``.
"""

from __future__ import annotations

import torch

from dataplane.intmath import next_pow2
from dataplane.ops.lora_fold import FoldedExpand
from dataplane.parallel.errors import ShardShapeError
from dataplane.parallel.shard import LocalFactors


class FoldStore:
    def __init__(self, weight: torch.Tensor, widths: tuple[int, ...], hot_slots: int,
                 max_rank: int) -> None:
        if hot_slots <= 0 or max_rank <= 0:
            raise ShardShapeError("a LoRA fold needs hot slots and a rank")
        self.widths, self.hot_slots = widths, hot_slots
        self.rank = next_pow2(max_rank)
        self.cols = hot_slots * len(widths) * self.rank
        n, d_in = weight.shape
        self.weight_aug = torch.zeros(n + self.cols, d_in, dtype=weight.dtype,
                                      device=weight.device)
        self.weight_aug[:n].copy_(weight)
        self.base_rows = n
        self.b = tuple(torch.zeros(hot_slots, self.rank, w, dtype=weight.dtype,
                                   device=weight.device) for w in widths)
        self.scale = torch.zeros(hot_slots, len(widths), dtype=torch.float32,
                                 device=weight.device)
        self.uses = 0
        """Host-side count of folded forwards (eager steps and graph captures)."""

    def _tail(self, slot: int, k: int) -> torch.Tensor:
        start = self.base_rows + (slot * len(self.widths) + k) * self.rank
        return self.weight_aug[start:start + self.rank]

    def write(self, slot: int, local: dict[int, LocalFactors]) -> None:
        """Slot `slot`'s local factors (absent slices: rank 0)."""
        if not 0 <= slot < self.hot_slots:
            raise ShardShapeError(f"slot {slot} outside the fold's {self.hot_slots} slots")
        for k, f in local.items():
            r = f.a.shape[0]
            if r > self.rank or f.b.shape != (self.widths[k], r):
                raise ShardShapeError(f"slot {slot} slice {k}: factors do not fit the fold")
        self.clear(slot)
        with torch.no_grad():
            for k, f in local.items():
                r = f.a.shape[0]
                self._tail(slot, k)[:r].copy_(f.a)
                self.b[k][slot, :r].copy_(f.b.t())
                self.scale[slot, k] = f.scale

    def clear(self, slot: int) -> None:
        if not 0 <= slot < self.hot_slots:
            raise ShardShapeError(f"slot {slot} outside the fold's {self.hot_slots} slots")
        with torch.no_grad():
            for k in range(len(self.widths)):
                self._tail(slot, k).zero_()
                self.b[k][slot].zero_()
            self.scale[slot].zero_()

    def expand(self, row_slot: torch.Tensor) -> FoldedExpand:
        """The consumer's view for one step (`row_slot`: int32 [T], every slot < H)."""
        self.uses += 1
        return FoldedExpand(row_slot, self.b, self.scale)
