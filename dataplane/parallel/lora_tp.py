"""The LoRA branch of one tensor-parallel projection, in either layout.

Notation per rank j of N (PEFT orientation; `s` = scale, per row's slot):

column-parallel base (output-sharded ``y_j = x W_j^T``, x replicated):
    no_extra_collectives  ``y_j += s (x A^T) B_j^T``                 0 extra calls
    paper                 ``z_j = x A_j^T`` (r/N wide);
                          ``z = AllGather_rank(z_0..z_{N-1})``;
                          ``y_j += s z B_j^T``                       1 all-gather (all
                                                                     fused slices at once)
row-parallel base (input-sharded; ``y = AllReduce(x_j W_j^T)``, added by the caller):
    no_extra_collectives  ``p_j += s (x_j A_j^T) B^T``, before the base all-reduce:
                          ``sum_j (x_j A_j^T) B^T = (x A^T) B^T``   0 extra calls
    paper                 ``z = AllReduce(x_j A_j^T)``; ``p_j[:, out_j] += s z B_j^T``
                          (disjoint slices ride on the base all-reduce) 1 all-reduce

The local arithmetic is the kernels backend's (`LoraBackend.shrink/expand/add_lora`) on a
per-rank `LoraFactorTable` holding the shards; only the paper schedule splits shrink and
expand around its collective. The bottleneck crosses the wire in `bottleneck_dtype`
(default float32, the kernels' accumulation dtype).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from dataplane.kernels.factor_table import LoraFactorTable
from dataplane.layers.lora_linear import LoraStepContext
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.errors import IndivisibleShardError, ShardShapeError
from dataplane.parallel.shard import (
    COLUMN,
    LAYOUT_PAPER,
    LocalFactors,
    check_style_layout,
    shard_interval,
    shard_lora_factors,
)

GlobalSliceFactors = Mapping[int, tuple[torch.Tensor, torch.Tensor, float]]
"""slice index -> (A [r, d_in], B [d_out_k, r], scale), global PEFT orientation."""


def assemble_rank_slices(gathered: torch.Tensor, local_ranks: torch.Tensor) -> torch.Tensor:
    """Concatenate per-rank bottleneck slices along the rank axis, row by row.

    `gathered` ``[N, T, NS, Rl]`` (rank j's ``z_j``, valid in ``[:rl]``); `local_ranks`
    int ``[T, NS]`` (``rl = r/N`` of each row's slot, 0 = none). Returns float32
    ``[1, T, NS, N*Rl]`` with ``out[0, t, k, j*rl + i] = gathered[j, t, k, i]`` for
    ``i < rl`` and 0 beyond ``N*rl`` — mixed ranks keep their own concatenation points.
    """
    n, t, ns, rl_max = gathered.shape
    pos = torch.arange(n * rl_max, device=gathered.device)
    rl = local_ranks.to(torch.int64).clamp(min=1)[:, :, None]
    src_rank = torch.div(pos, rl, rounding_mode="floor").clamp(max=n - 1)
    src_col = pos % rl
    rows = torch.arange(t, device=gathered.device)[:, None, None]
    cols = torch.arange(ns, device=gathered.device)[None, :, None]
    out = gathered.float()[src_rank, rows, cols, src_col]
    valid = pos < n * local_ranks.to(torch.int64)[:, :, None]
    return torch.where(valid, out, torch.zeros((), device=out.device)).unsqueeze(0)


class ShardedLoraBranch:
    """Local factor table + forward of the LoRA branch of one parallel projection.

    Args:
        style / layout: see module docstring.
        in_features / out_features: the *local* base shapes (column: d_in, widths/N;
            row: d_in/N, (d_out,)); the row/paper table expands into d_out/N columns.
        max_rank: the largest global rank a slot may hold (divisible by N for column/paper).
        out_units: per slice, the unit B's output rows are sharded in (head_dim for q/k/v).
        out_replicate: per slice, whether those units may be replicated (k/v heads fewer
            than the ranks, `dataplane.parallel.shard.shard_interval`).
    """

    def __init__(self, style: str, layout: str, group: TPGroup, *, num_slots: int,
                 in_features: int, out_features: tuple[int, ...], max_rank: int,
                 dtype: torch.dtype, out_units: tuple[int, ...] | None = None,
                 out_replicate: tuple[bool, ...] | None = None,
                 bottleneck_dtype: torch.dtype = torch.float32) -> None:
        check_style_layout(style, layout)
        if style == COLUMN and layout == LAYOUT_PAPER and max_rank % group.size:
            raise IndivisibleShardError(f"max rank {max_rank} does not split over "
                                        f"{group.size} ranks")
        self.style, self.layout, self.group = style, layout, group
        if style != COLUMN and layout == LAYOUT_PAPER:  # B output-sharded: expand one slice
            out_features = tuple(
                hi - lo for lo, hi in (shard_interval(w, group.rank, group.size,
                                                      what="row-parallel output")
                                       for w in out_features))
        self.out_units = out_units or (1,) * len(out_features)
        self.out_replicate = out_replicate or (False,) * len(out_features)
        self.bottleneck_dtype = bottleneck_dtype
        self.table = LoraFactorTable(num_slots, in_features, out_features, max_rank, dtype,
                                     group.device)
        self.shrink_weights = self.table.weights
        self.shrink_ranks: torch.Tensor | None = None
        if style == COLUMN and layout == LAYOUT_PAPER:
            # Same storage; the shrink reads only the r/N local A rows of each slot.
            self.shrink_ranks = torch.zeros_like(self.table.ranks)
            self.shrink_weights = dataclasses.replace(self.table.weights,
                                                      ranks=self.shrink_ranks)
        self.local: dict[int, dict[int, LocalFactors]] = {}

    @property
    def paper(self) -> bool:
        return self.layout == LAYOUT_PAPER

    def shard(self, factors: GlobalSliceFactors) -> dict[int, LocalFactors]:
        """This rank's factors of one adapter (validated, nothing written)."""
        out = {}
        for k, (a, b, scale) in factors.items():
            if not 0 <= k < len(self.out_units):
                raise ShardShapeError(f"slice {k} outside [0, {len(self.out_units)})")
            out[k] = shard_lora_factors(a, b, scale, style=self.style, layout=self.layout,
                                        tp_rank=self.group.rank, tp_size=self.group.size,
                                        out_unit=self.out_units[k],
                                        out_replicate=self.out_replicate[k])
        return out

    def load_slot(self, slot: int, factors: GlobalSliceFactors) -> None:
        """Shard one adapter's global factors and write this rank's part into `slot`.

        Every slice is sharded and shape-checked before the table is touched.
        """
        local = self.shard(factors)
        table_factors = {}
        for k, f in local.items():
            a = f.a
            if self.shrink_ranks is not None:  # pad A to r rows: the table pairs A and B by r
                a = torch.zeros(f.rank, f.a.shape[1], dtype=f.a.dtype)
                a[: f.a.shape[0]] = f.a
            table_factors[k] = (a, f.b, f.scale)
        self.table.set_slot(slot, table_factors)
        if self.shrink_ranks is not None:
            self.shrink_ranks[:, slot] = 0
            for k, f in local.items():
                self.shrink_ranks[k, slot] = f.a.shape[0]
        self.local[slot] = local

    def clear_slot(self, slot: int) -> None:
        self.table.clear_slot(slot)
        if self.shrink_ranks is not None:
            self.shrink_ranks[:, slot] = 0
        self.local.pop(slot, None)

    def resident_scalars(self) -> int:
        """Factor scalars this rank holds for its loaded slots (no table padding)."""
        return sum(f.a.numel() + f.b.numel() for per in self.local.values()
                   for f in per.values())

    def warm_up(self, ctx: LoraStepContext) -> None:
        """Launch this branch's kernels once on zeros for `ctx`'s rows (no collective; the
        step's rows should have no adapter, so nothing is written): Triton compiles the
        variants an eager step of that size uses now rather than mid-serving. The paper
        row layout's expand writes a column window of `y` in serving (another stride);
        here it expands into a contiguous `y`, so that variant may still compile on
        first use."""
        w = self.table.weights
        rows = ctx.meta.num_rows
        x = torch.zeros(rows, w.in_features, dtype=w.storage.dtype, device=w.storage.device)
        y = torch.zeros(rows, sum(w.out_features), dtype=w.storage.dtype,
                        device=w.storage.device)
        if not self.paper:
            ctx.backend.add_lora(y, x, ctx.meta, w, ctx.workspace)
            return
        z = ctx.backend.shrink(x, ctx.meta, self.shrink_weights, ctx.workspace)
        z_full = torch.zeros(1, rows, z.shape[2], w.max_rank, dtype=torch.float32,
                             device=z.device)
        ctx.backend.expand(y, z_full, ctx.meta, w)

    def apply_silu_mul(self, gate_up: torch.Tensor, x: torch.Tensor, ctx: LoraStepContext
                       ) -> torch.Tensor | None:
        """``silu(gate + Δgate) * (up + Δup)`` of a column-parallel gate/up shard in one
        pass (``LoraBackend.add_lora_silu_mul`` on this rank's table: in the default
        layout every rank holds the whole ``A`` and its ``B`` columns, so the fold is the
        one-GPU one), or None (`gate_up` untouched): the paper layout, whose expand follows
        its all-gather, or a step the backend does not fold."""
        if self.paper or self.style != COLUMN:
            return None
        return ctx.backend.add_lora_silu_mul(gate_up, x, ctx.meta, self.table.weights,
                                             ctx.workspace)

    def apply(self, y: torch.Tensor, x: torch.Tensor, ctx: LoraStepContext,
              out_slice: tuple[int, int] | None = None,
              trace: dict[str, torch.Tensor] | None = None) -> None:
        """Add the branch into `y` in place.

        Column: `y` is the local output ``[T, sum(widths/N)]``, `x` ``[T, d_in]``.
        Row: `y` is this rank's base partial ``[T, d_out]`` *before* the base all-reduce,
        `x` ``[T, d_in/N]``; `out_slice` = this rank's output columns (paper layout).
        `trace`, when given, receives copies of the intermediates (the exact two-rank trace test).
        """
        backend, meta, ws = ctx.backend, ctx.meta, ctx.workspace
        if not self.paper:
            before = y.clone() if trace is not None else None
            backend.add_lora(y, x, meta, self.table.weights, ws)
            if trace is not None and before is not None:
                trace["delta"] = y - before
            return
        if self.style != COLUMN and out_slice is None:  # checked before any collective
            raise ShardShapeError("row-parallel paper layout needs this rank's out_slice")
        z = backend.shrink(x, meta, self.shrink_weights, ws)
        zsum = z.sum(0) if z.shape[0] > 1 else z[0]
        if self.style == COLUMN:
            rl_max = self.table.max_rank // self.group.size
            z_local = zsum[:, :, :rl_max].to(self.bottleneck_dtype).contiguous()
            gathered = self.group.all_gather(z_local, purpose="lora")
            slot = meta.row_slot.to(torch.int64)
            ranks = self.shrink_ranks if self.shrink_ranks is not None else self.table.ranks
            local_ranks = ranks.t()[slot.clamp(min=0)]
            local_ranks = torch.where(slot[:, None] >= 0, local_ranks, 0)
            z_full = assemble_rank_slices(gathered, local_ranks)
            target = y
        else:
            z_local = zsum.to(self.bottleneck_dtype).contiguous()
            partial = z_local.clone() if trace is not None else None
            self.group.all_reduce(z_local, purpose="lora")
            z_full = z_local.float().unsqueeze(0)
            lo, hi = out_slice if out_slice is not None else (0, y.shape[1])
            target = y[:, lo:hi]
            if trace is not None and partial is not None:
                trace["bottleneck_partial"] = partial
        before = target.clone() if trace is not None else None
        backend.expand(target, z_full.contiguous(), meta, self.table.weights)
        if trace is not None and before is not None:
            trace["bottleneck_local"] = z_local.clone() if self.style == COLUMN else z_local
            trace["bottleneck"] = z_full[0].clone()
            trace["delta"] = target - before
