"""One projection's LoRA fold (dataplane/ops/lora_fold.py): its slots' factors laid out
for the base GEMM and the consumer op.

The projection's base weight becomes the top rows of ``weight_aug`` ``[N + H*C, d_in]``;
below it, slot ``s < H`` holds each slice's local ``A`` (zero-padded to R rows, the power
of two at or above the largest rank), so one GEMM gives ``[y | z]`` and the shrink costs
the GEMM ``H*C`` more output columns instead of a launch. ``b[k]`` ``[H, R, w_k]`` holds
slice k's local ``B`` (transposed) and ``scale`` ``[H, slices]`` the scales: what the
projection's consumer needs to add each row's expand.

A model whose tables hold more slots than a folded step can use keeps fewer fold slots
and maps table slots onto them (dataplane/layers/lora_fold_slots.py, `copy_in`).

Factors are written in PEFT orientation (``A [r, d_in]``, ``B [w_k, r]``), the ones the
projection itself holds: one GPU's whole factors (`LoRALinear`), or under tensor
parallelism (default layout) a rank's shard — column-parallel ``A`` replicated and ``B``
output-sharded; row-parallel ``A`` input-sharded and ``B`` replicated, ``z`` a partial
sum that the base all-reduce completes with ``y``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from dataplane.intmath import next_pow2
from dataplane.kernels.errors import LoraShapeError, LoraSlotError
from dataplane.kernels.factor_table import LoraFactorTable
from dataplane.ops.lora_fold import FoldedExpand

SliceFactors = Mapping[int, tuple[torch.Tensor, torch.Tensor, float]]
"""slice k -> (A [r, d_in], B [w_k, r], scale), as `LoraFactorTable.set_slot` takes."""


class FoldStore:
    def __init__(self, weight: torch.Tensor, widths: tuple[int, ...], hot_slots: int,
                 max_rank: int) -> None:
        if hot_slots <= 0 or max_rank <= 0:
            raise LoraShapeError("a LoRA fold needs slots and a rank")
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

    @property
    def nbytes(self) -> int:
        """Device bytes of the fold slots: the ``A`` rows under the base weight, ``B`` and
        the scales (the base rows are the projection's own weight)."""
        es = self.weight_aug.element_size()
        return (self.cols * self.weight_aug.shape[1] * es
                + sum(b.numel() for b in self.b) * es + self.scale.numel() * 4)

    def _tail(self, slot: int, k: int) -> torch.Tensor:
        start = self.base_rows + (slot * len(self.widths) + k) * self.rank
        return self.weight_aug[start:start + self.rank]

    def write(self, slot: int, factors: SliceFactors) -> None:
        """Slot `slot`'s factors (absent slices: rank 0); all checked before writing."""
        self._check_slot(slot)
        for k, (a, b, _scale) in factors.items():
            r = a.shape[0]
            if not 0 <= k < len(self.widths) or r > self.rank or b.shape != (self.widths[k], r):
                raise LoraShapeError(f"slot {slot} slice {k}: factors do not fit the fold")
        self.clear(slot)
        with torch.no_grad():
            for k, (a, b, scale) in factors.items():
                r = a.shape[0]
                self._tail(slot, k)[:r].copy_(a)
                self.b[k][slot, :r].copy_(b.t())
                self.scale[slot, k] = float(scale)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.hot_slots:
            raise LoraSlotError(f"slot {slot} outside the fold's {self.hot_slots} slots")

    def clear(self, slot: int) -> None:
        self._check_slot(slot)
        with torch.no_grad():
            for k in range(len(self.widths)):
                self._tail(slot, k).zero_()
                self.b[k][slot].zero_()
            self.scale[slot].zero_()

    def copy_in(self, table: LoraFactorTable, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Fold slots `dst` <- `table`'s slots `src` (int64 device tensors, one fold slot per
        table slot, all checked by the caller): device copies from the table's stacked
        views. A slice's rank rows past its rank are zero in the table, and the fold's rows
        past the table's rank are never written, so both copy over whatever was there."""
        assert table.weights.stacked is not None
        tail = self.weight_aug[self.base_rows:].view(self.hot_slots, len(self.widths),
                                                     self.rank, -1)
        rt = table.max_rank
        with torch.no_grad():
            for k, (a, b) in enumerate(table.weights.stacked):
                tail[dst, k, :rt] = a.index_select(0, src)
                self.b[k][dst, :rt] = b.index_select(0, src)
            self.scale[dst] = table.scales.index_select(1, src).t()

    def copy_ranges(self, table: LoraFactorTable) -> np.ndarray:
        """What `copy_in` moves, as byte ranges for a batched copy (dataplane/ops/triton/
        copy_jobs.py): int64 ``[3 * slices, 5]``, one row per block a slot's copy moves
        (each slice's ``A`` rows, ``B`` rows and scale): (source address of table slot 0,
        source bytes per table slot, destination address of fold slot 0, destination
        bytes per fold slot, bytes)."""
        assert table.weights.stacked is not None
        es, rt = self.weight_aug.element_size(), table.max_rank
        tail = self.weight_aug[self.base_rows:].view(self.hot_slots, len(self.widths),
                                                     self.rank, -1)
        rows = []
        for k, (a, b) in enumerate(table.weights.stacked):
            rows.append((a.data_ptr(), a.stride(0) * es, tail[0, k].data_ptr(),
                         tail.stride(0) * es, rt * a.shape[2] * es))
            rows.append((b.data_ptr(), b.stride(0) * es, self.b[k].data_ptr(),
                         self.b[k].stride(0) * es, rt * b.shape[2] * es))
            rows.append((table.scales[k].data_ptr(), table.scales.stride(1) * 4,
                         self.scale[0, k].data_ptr(), self.scale.stride(0) * 4, 4))
        return np.array(rows, dtype=np.int64)

    def gemm_weight(self, width: int = 0) -> torch.Tensor:
        """The base rows and the first `width` fold slots' ``A`` rows (0: every slot): a
        step whose rows use only fold slots below `width` need not read the others."""
        width = width or self.hot_slots
        if not 0 < width <= self.hot_slots:
            raise LoraSlotError(f"fold width {width} outside [1, {self.hot_slots}]")
        return self.weight_aug[:self.base_rows + width * len(self.widths) * self.rank]

    def split(self, y_aug: torch.Tensor, bias: torch.Tensor | None, row_slot: torch.Tensor
              ) -> tuple[torch.Tensor, tuple[torch.Tensor, FoldedExpand]]:
        """``x gemm_weight(w)^T`` -> (y + bias, (z tail, the step's expand)) for the
        consumer op; the fold width w is read off the tail's columns."""
        y = y_aug[:, :self.base_rows]
        if bias is not None:
            y += bias
        tail = y_aug[:, self.base_rows:]
        return y, (tail, self.expand(row_slot, tail.shape[1] // (len(self.widths) * self.rank)))

    def expand(self, row_slot: torch.Tensor, width: int = 0) -> FoldedExpand:
        """The consumer's view for one step (`row_slot`: each row's fold slot, int32 [T],
        -1 or < `width`; `width` 0: every fold slot)."""
        self.uses += 1
        width = width or self.hot_slots
        return FoldedExpand(row_slot, tuple(b[:width] for b in self.b), self.scale[:width])
