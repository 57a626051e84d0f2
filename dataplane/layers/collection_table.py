"""Compress-then-Serve members served natively: shared bases resident once, a core per slot.

A collection member's update of one projection slice is ``ΔW_i = U_c Σ_i V_cᵀ``:
bases ``U_c [d_out, R]``, ``V_c [d_in, R]`` shared by every member of cluster
``c``, and a small core ``Σ_i [R, R]`` of its own. One `CollectionTable` per (layer, fused
projection) holds ``K`` basis *blocks* (a block = one resident cluster of one collection)
and one core per adapter slot, and adds to ``y`` for every row whose slot holds a member:

    h = x V_{block(slot)}        [T, NS, R]   one GEMM over all blocks, then each row's block
    g = Σ_slot h                 [T, NS, R]   per row (cores of other slots: zero)
    y += g U_{block}ᵀ                         one GEMM over all blocks and slices

Rows of ordinary LoRA slots or of the base (slot -1) meet a zero core, so their delta is
exactly zero. Every operation has the step's static shapes and reads only device tensors
(no host sync): a decode step using it can be captured in a CUDA graph. Bytes resident:
``K R (d_in + NS Σ_k w_k)`` for the bases (``U`` block-diagonal over the slices, so one GEMM
adds them all) plus ``S NS R²`` for the cores, against
``n R (d_in + d_out)`` for the same members materialised as rank-R LoRAs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from dataplane.collections.errors import CollectionError


class CollectionRows(NamedTuple):
    """One step's rows as the collection tables read them (built once per step)."""

    slots: torch.Tensor
    """int64 [T]: each row's slot, the base's zero-core row ``S`` for slot -1."""
    block: torch.Tensor
    """int64 [T]: the basis block each row's slot reads."""
    onehot: torch.Tensor | None
    """[T, K] block selector in the model dtype (None with one block)."""


class CollectionTable:
    """Bases and cores of the collection members of one (layer, fused projection).

    Args:
        num_slots: ``S``, the engine's adapter slots (a member occupies one).
        in_features: ``d_in``; out_features: slice widths (``(q, kv, kv)`` for q/k/v).
        blocks: ``K``, basis blocks resident at once; rank: ``R`` of every block (a
            smaller fitted rank is zero-padded, which is exact).
    """

    def __init__(self, num_slots: int, in_features: int, out_features: Sequence[int],
                 blocks: int, rank: int, dtype: torch.dtype, device: torch.device) -> None:
        if min(num_slots, in_features, blocks, rank) <= 0 or not out_features:
            raise CollectionError("collection tables need slots, blocks and rank > 0")
        self.num_slots, self.in_features = num_slots, in_features
        self.out_features = tuple(int(w) for w in out_features)
        self.blocks, self.rank, self.dtype = blocks, rank, dtype
        ns = len(self.out_features)
        self.vt = torch.zeros(ns * blocks * rank, in_features, dtype=dtype, device=device)
        """Row ``(k K + b) R + j`` = column ``j`` of slice ``k``'s ``V`` in block ``b``."""
        self.ut = torch.zeros(ns * blocks * rank, sum(self.out_features), dtype=dtype,
                              device=device)
        """Row ``(k K + b) R + j`` = column ``j`` of slice ``k``'s ``U`` in block ``b``, placed
        in slice ``k``'s output columns (zero elsewhere): one GEMM adds every slice."""
        self.offsets = [sum(self.out_features[:k]) for k in range(ns)]
        self.cores = torch.zeros(num_slots + 1, ns, rank, rank, dtype=dtype, device=device)
        """Row ``S`` is the base row's zero core (slot -1 maps there)."""
        self.slot_block = torch.zeros(num_slots + 1, dtype=torch.int64, device=device)
        self.active = False
        """Host-side: some slot holds a member (kept by the collection registry)."""

    # ----- writes (before a member is published; never while a row can read them) ---------
    def write_block(self, block: int, bases: Mapping[int, tuple[torch.Tensor, torch.Tensor]]
                    ) -> None:
        """Place ``{slice k: (U [w_k, r], V [d_in, r])}`` in ``block``; absent slices and
        columns beyond ``r`` are zero."""
        self.clear_block(block)
        for k, (u, v) in bases.items():
            r = int(u.shape[1])
            col = (k * self.blocks + block) * self.rank
            self.vt[col:col + r] = v.t().to(self.dtype)
            start = self.offsets[k]
            self.ut[col:col + r, start:start + u.shape[0]] = u.t().to(self.dtype)

    def clear_block(self, block: int) -> None:
        for k in range(len(self.out_features)):
            col = (k * self.blocks + block) * self.rank
            self.vt[col:col + self.rank] = 0
            self.ut[col:col + self.rank] = 0

    def write_core(self, slot: int, block: int, cores: Mapping[int, torch.Tensor]) -> None:
        """Slot ``slot`` reads ``block`` with ``{slice k: Σ [r, r]}`` (absent slices: zero)."""
        self.cores[slot].zero_()
        for k, core in cores.items():
            r = int(core.shape[0])
            self.cores[slot, k, :r, :r] = core.to(self.dtype)
        self.slot_block[slot] = block

    def clear_core(self, slot: int) -> None:
        self.cores[slot].zero_()
        self.slot_block[slot] = 0

    # ----- the step ------------------------------------------------------------------------
    def rows(self, row_slot: torch.Tensor) -> CollectionRows:
        """The step's per-row slot, block and block selector; every table of one runner
        maps a slot to the same block, so one `rows` serves all of a step's projections."""
        slots = row_slot.to(torch.int64)
        slots = torch.where(slots < 0, self.num_slots, slots)
        block = self.slot_block.index_select(0, slots)
        onehot = (F.one_hot(block, self.blocks).to(self.dtype) if self.blocks > 1 else None)
        return CollectionRows(slots, block, onehot)

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, row_slot: torch.Tensor,
                  rows: CollectionRows | None = None) -> None:
        """``y[t, slice k] += U Σ_{slot(t)} Vᵀ x[t]`` for member rows, in place."""
        t, ns, k_blocks, r = x.shape[0], len(self.out_features), self.blocks, self.rank
        if rows is None:
            rows = self.rows(row_slot[:t])
        h = F.linear(x, self.vt).view(t, ns, k_blocks, r)
        if rows.onehot is not None:
            h = h.gather(2, rows.block.view(t, 1, 1, 1).expand(t, ns, 1, r))
        g = torch.matmul(self.cores.index_select(0, rows.slots), h.view(t, ns, r, 1))
        spread = (g if rows.onehot is None else
                  rows.onehot.view(t, 1, k_blocks, 1) * g.view(t, ns, 1, r))
        y.addmm_(spread.reshape(t, ns * k_blocks * r), self.ut)

    @property
    def nbytes(self) -> int:
        tensors = [self.vt, self.ut, self.cores, self.slot_block]
        return sum(t.numel() * t.element_size() for t in tensors)
