"""A self-contained factor table for one (layer, module): storage + address tables.

Wherever the unified page pool does not place factors (tensor-parallel ranks' shards,
tests, benchmarks), each module's factors live here. The storage is one flat tensor; every
rank row has a fixed home, so loading a slot writes its rows in place and
republishes nothing (no per-step copies). Two layouts, same kernels:

* ``"stacked"``: slot ``s`` rank row ``i`` of slice ``k`` lives at
  ``((k-block) + (s * R + i) * width)``; the torch backend can then use strided
  views (``LoraModuleWeights.stacked``) instead of gathering.
* ``"scattered"``: the same rows at a fixed random permutation of homes, the
  address pattern a page pool produces; it exercises and times the paged path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from dataplane.kernels.base import LoraModuleWeights
from dataplane.kernels.errors import LoraRankError, LoraShapeError, LoraSlotError


class SlotMirror(Protocol):
    """A second copy of the table's slots kept in step (e.g. a projection's LoRA fold,
    dataplane/layers/lora_fold_store.py): told of every write and clear."""

    def write(self, slot: int,
              factors: Mapping[int, tuple[torch.Tensor, torch.Tensor, float]]) -> None: ...

    def clear(self, slot: int) -> None: ...


class LoraFactorTable:
    """Factors of every slot for one module with ``NS`` output slices.

    Args:
        num_slots: ``S``.
        in_features: ``d_in``.
        out_features: slice widths, e.g. ``(4096, 1024, 1024)`` for GQA q/k/v.
        max_rank: ``R``, the largest rank a slot may load.
        layout: ``"stacked"`` or ``"scattered"`` (see module docstring).
        seed: permutation seed for ``"scattered"``.
    """

    def __init__(
        self,
        num_slots: int,
        in_features: int,
        out_features: Sequence[int],
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device | str,
        layout: str = "stacked",
        seed: int = 0,
    ) -> None:
        if num_slots <= 0 or in_features <= 0 or max_rank <= 0 or not out_features:
            raise LoraShapeError("num_slots, in_features, max_rank and out_features must be > 0")
        if any(w <= 0 for w in out_features):
            raise LoraShapeError(f"slice widths must be > 0, got {list(out_features)}")
        if layout not in ("stacked", "scattered"):
            raise LoraShapeError(f"unknown layout {layout!r}")
        self.num_slots, self.in_features, self.max_rank = num_slots, in_features, max_rank
        self.out_features = tuple(int(w) for w in out_features)
        self.dtype, self.device, self.layout = dtype, torch.device(device), layout
        s, r, ns = num_slots, max_rank, len(self.out_features)
        gen = torch.Generator().manual_seed(seed)

        a_rows = torch.empty(ns, s, r, dtype=torch.int64)
        b_rows = torch.empty(ns, s, r, dtype=torch.int64)
        base = 0
        blocks: list[tuple[int, int, int]] = []  # (a_base, b_base, width) per slice
        for k, width in enumerate(self.out_features):
            for rows, w in ((a_rows, in_features), (b_rows, width)):
                home = torch.arange(s * r, dtype=torch.int64)
                if layout == "scattered":
                    home = home[torch.randperm(s * r, generator=gen)]
                rows[k] = (base + home * w).view(s, r)
                base += s * r * w
            blocks.append((int(a_rows[k, 0, 0]), int(b_rows[k, 0, 0]), width))
        self.storage = torch.zeros(base, dtype=dtype, device=self.device)
        self.a_rows = a_rows.to(self.device)
        self.b_rows = b_rows.to(self.device)
        self.ranks = torch.zeros(ns, s, dtype=torch.int32, device=self.device)
        self.scales = torch.zeros(ns, s, dtype=torch.float32, device=self.device)
        self.mirror: SlotMirror | None = None
        self._a_rows_host, self._b_rows_host = a_rows, b_rows
        stacked = None
        if layout == "stacked":
            views = []
            for k, width in enumerate(self.out_features):
                a0 = int(a_rows[k, 0, 0])
                b0 = int(b_rows[k, 0, 0])
                a = self.storage[a0 : a0 + s * r * in_features].view(s, r, in_features)
                b = self.storage[b0 : b0 + s * r * width].view(s, r, width)
                views.append((a, b))
            stacked = tuple(views)
        self.weights = LoraModuleWeights(
            storage=self.storage,
            a_rows=self.a_rows,
            b_rows=self.b_rows,
            ranks=self.ranks,
            scales=self.scales,
            in_features=in_features,
            out_features=self.out_features,
            max_rank=max_rank,
            stacked=stacked,
            addr_align=power_of_two_divisor(math.gcd(in_features, *self.out_features), 16),
            slot_versions=np.zeros(num_slots, dtype=np.int64),
        )
        self.weights.validate()

    def set_slot(
        self,
        slot: int,
        factors: Mapping[int, tuple[torch.Tensor, torch.Tensor, float]],
    ) -> None:
        """Load one slot: ``factors[k] = (A [r, d_in], B [w_k, r], scale)``.

        ``B`` is given in PEFT orientation (``lora_B.weight``) and stored
        transposed. Slices missing from ``factors`` get rank 0 (zero delta).
        All inputs are validated before anything is written.
        """
        if not 0 <= slot < self.num_slots:
            raise LoraSlotError(f"slot {slot} outside [0, {self.num_slots})")
        for k, (a, b, _scale) in factors.items():
            if not 0 <= k < len(self.out_features):
                raise LoraShapeError(f"slice {k} outside [0, {len(self.out_features)})")
            r = a.shape[0]
            if not 0 < r <= self.max_rank:
                raise LoraRankError(f"rank {r} outside (0, {self.max_rank}]")
            if tuple(a.shape) != (r, self.in_features) or tuple(b.shape) != (
                self.out_features[k],
                r,
            ):
                raise LoraShapeError(
                    f"slice {k}: A {list(a.shape)} / B {list(b.shape)} do not match "
                    f"[r, {self.in_features}] / [{self.out_features[k]}, r]"
                )
        self.clear_slot(slot)
        for k, (a, b, scale) in factors.items():
            r = a.shape[0]
            width = self.out_features[k]
            self._write_rows(self._a_rows_host[k, slot, :r], a, self.in_features)
            self._write_rows(self._b_rows_host[k, slot, :r], b.t(), width)
            self.ranks[k, slot] = r
            self.scales[k, slot] = float(scale)
        if self.mirror is not None:
            self.mirror.write(slot, factors)

    def clear_slot(self, slot: int) -> None:
        """Rank 0 for every slice and zeroed rows (no stale tails)."""
        if not 0 <= slot < self.num_slots:
            raise LoraSlotError(f"slot {slot} outside [0, {self.num_slots})")
        for k, width in enumerate(self.out_features):
            self.storage[self._row_index(self._a_rows_host[k, slot], self.in_features)] = 0
            self.storage[self._row_index(self._b_rows_host[k, slot], width)] = 0
        self.ranks[:, slot] = 0
        self.scales[:, slot] = 0.0
        self._bump(slot)
        if self.mirror is not None:
            self.mirror.clear(slot)

    def _bump(self, slot: int) -> None:
        """A slot's factors changed: consumers' copies of them are stale."""
        assert self.weights.slot_versions is not None
        self.weights.slot_versions[slot] += 1

    def _row_index(self, homes: torch.Tensor, width: int) -> torch.Tensor:
        """Flat storage indices of rows starting at ``homes``, built on the device."""
        start = homes.to(self.device)[:, None]
        return (start + torch.arange(width, dtype=torch.int64, device=self.device)).reshape(-1)

    def _write_rows(self, homes: torch.Tensor, rows: torch.Tensor, width: int) -> None:
        self.storage[self._row_index(homes, width)] = rows.to(self.device, self.dtype).reshape(-1)


def power_of_two_divisor(value: int, cap: int) -> int:
    """Largest power of two <= ``cap`` dividing ``value``."""
    p = 1
    while p < cap and value % (p * 2) == 0:
        p *= 2
    return p
