"""The torch backend's grouped path: a step's LoRA rows in two batched matmuls per projection.

For a group of slots (`group_plans`: usually all of a step's slots), per projection:

    xs = x[rows of slot lo..hi, padded to m per slot]        [G, m, d_in]
    z  = xs @ A[lo..hi]^T                                    [G, m, NS*R]
    y[rows] += z @ Bt[lo..hi]                                [G, m, sum(w_k)]

``A[s]`` stacks every slice's rank rows (slice k at rows ``k*R``, zero past its rank) and
``Bt[s]`` is block-diagonal over the slices (slice k's rank rows, times the slice's
scale, in slice k's columns), so one shrink and one expand serve all fused slices and
all slots of the group: a fixed handful of ops per projection, whatever the slot count
(on a shared CPU every op is also a thread fork/join), and ``m*NS*R`` products per row
against the batched path's every-row-meets-every-slot ``L``; the block-diagonal ``Bt``
costs ``NS`` times the expand's useful products, a few percent of the base GEMM's. Rows
are padded per slot to the group's largest count ``m`` over its slot range ``lo..hi``;
padded rows are dropped before the scatter, so only a slot's own rows are written.

A plan whose rows are one contiguous run of the batch with no padding (a prefill chunk
of one slot, or a decode batch already in slot order with equal counts) reads ``x`` and
accumulates into ``y`` in place: two ops (``bmm``, ``baddbmm_``), no gather and no scatter.

The stacked copies live in a :class:`SlotFactorCache` per projection, filled from the
tables (the unified pool's pages through the row-address tables, or a stacked table's
views) the first time a slot is used at a publication version
(``LoraModuleWeights.slot_versions``): unlike a gather per step, a step reads each live
factor once, in place. Only live rank rows are copied (whatever a page holds past a
slot's rank is never read) and a slice of rank 0 has a zero ``A`` and ``Bt``. The scale
is applied to ``Bt`` in float32 when it is copied, rounded once to the factors' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.kernels.base import LoraModuleWeights, gather_rank_rows


@dataclass(frozen=True)
class GroupPlan:
    """Rows of a group of slots, padded per slot (shared by every projection of a step)."""

    lo: int  # first slot of the range
    groups: int  # G = hi - lo + 1
    m: int  # rows per group after padding
    gather: torch.Tensor  # int64 [G*m]: the row of x each padded position reads
    live: torch.Tensor | None  # int64 [n]: positions that are real rows; None: all are
    rows: torch.Tensor  # int64 [n]: the row each live position writes
    run: int | None  # first row when the rows are one unpadded contiguous run, else None


def group_plans(counts: list[int], rows: torch.Tensor, light_rows: int,
                max_padding: float = 0.25) -> list[GroupPlan]:
    """A step's rows (`counts[s]` per slot, `rows` int64 [n] grouped by slot in slot
    order) as few padded groups as the padding allows: all slots in one plan when it
    pads at most `max_padding` of the rows (a balanced prefill, a uniform decode), else
    the slots with at most `light_rows` rows in one plan and each heavier slot in a plan
    of its own (no padding). Fewer plans = fewer ops (each is ~6, whatever its size)."""
    on = [s for s, c in enumerate(counts) if c > 0]
    n = sum(counts)
    span = counts[on[0]:on[-1] + 1]
    if len(span) * max(span) <= (1 + max_padding) * n:
        return [group_plan(counts, rows)]
    plans, light, parts, start = [], [0] * len(counts), [], 0
    for s, c in enumerate(counts):
        own = rows[start:start + c]
        if c > light_rows:
            plans.append(group_plan([0] * s + [c], own))
        elif c > 0:
            light[s] = c
            parts.append(own)
        start += c
    if parts:
        plans.append(group_plan(light, torch.cat(parts)))
    return plans


def group_plan(counts: list[int], rows: torch.Tensor) -> GroupPlan:
    """`counts[s]` rows per slot (0: not on this path) and `rows` (int64 [n], grouped by
    slot in slot order) -> the padded grouping of the slots with rows."""
    on = [s for s, c in enumerate(counts) if c > 0]
    lo, hi = on[0], on[-1]
    m = max(counts[lo:hi + 1])
    gather: list[int] = []
    live: list[int] = []
    start = 0
    for g, c in enumerate(counts[lo:hi + 1]):
        gather.extend(range(start, start + c))
        gather.extend([start] * (m - c) if c else [0] * m)
        live.extend(range(g * m, g * m + c))
        start += c
    index = torch.tensor(gather, dtype=torch.int64, device=rows.device)
    padded = len(live) < len(gather)
    pos = torch.tensor(live, dtype=torch.int64, device=rows.device) if padded else None
    return GroupPlan(lo, hi - lo + 1, m, rows.index_select(0, index), pos, rows,
                     None if padded else _run_start(rows))


def _run_start(rows: torch.Tensor) -> int | None:
    """`rows[0]` when `rows` are consecutive ascending rows, else None."""
    first, last = int(rows[0]), int(rows[-1])
    if last - first + 1 != rows.numel():
        return None
    steps = rows[1:] - rows[:-1]
    return first if bool((steps == 1).all()) else None


class SlotFactorCache:
    """One projection's factors per slot, stacked for the grouped path (module docstring):
    ``a [S, NS*R, d_in]`` and ``bt [S, NS*R, sum(w_k)]`` (scaled), each slot tagged with
    the publication version it was copied at."""

    def __init__(self, w: LoraModuleWeights) -> None:
        s, c, dev = w.num_slots, w.num_slices * w.max_rank, w.storage.device
        self.a = torch.zeros(s, c, w.in_features, dtype=w.storage.dtype, device=dev)
        self.bt = torch.zeros(s, c, w.total_out, dtype=w.storage.dtype, device=dev)
        self.versions = [-1] * s

    def refresh(self, w: LoraModuleWeights, slots: range) -> None:
        """Copy in every slot of `slots` whose version moved since it was copied."""
        assert w.slot_versions is not None
        stale = [s for s in slots if self.versions[s] != int(w.slot_versions[s])]
        if not stale:
            return
        ranks, scales = w.ranks.tolist(), w.scales.tolist()
        offsets, big_r = w.slice_offsets(), w.max_rank
        with torch.no_grad():
            for s in stale:
                self.a[s].zero_()
                self.bt[s].zero_()
                for k, width in enumerate(w.out_features):
                    r, lo, col = ranks[k][s], k * big_r, offsets[k]
                    if r == 0:
                        continue
                    self.a[s, lo:lo + r] = _rows(w, k, 0, s, r)
                    bt = _rows(w, k, 1, s, r).float() * scales[k][s]
                    self.bt[s, lo:lo + r, col:col + width] = bt.to(self.bt.dtype)
                self.versions[s] = int(w.slot_versions[s])

    def add(self, y: torch.Tensor, x: torch.Tensor, plan: GroupPlan) -> None:
        """``y[rows] += delta`` of the plan's rows (module docstring)."""
        sl = slice(plan.lo, plan.lo + plan.groups)
        shape = (plan.groups, plan.m)
        at = self.a[sl].transpose(1, 2)
        if plan.run is not None and x.is_contiguous() and y.is_contiguous():
            end = plan.run + plan.groups * plan.m
            z = torch.bmm(x[plan.run:end].view(*shape, x.shape[1]), at)
            y[plan.run:end].view(*shape, y.shape[1]).baddbmm_(z, self.bt[sl])
            return
        z = torch.bmm(x.index_select(0, plan.gather).view(*shape, x.shape[1]), at)
        d = torch.bmm(z, self.bt[sl]).view(plan.groups * plan.m, -1)
        if plan.live is not None:
            d = d.index_select(0, plan.live)
        y.index_add_(0, plan.rows, d)


def _rows(w: LoraModuleWeights, k: int, which: int, s: int, r: int) -> torch.Tensor:
    """Slot `s`'s first `r` rank rows of slice `k`'s ``A`` (`which` 0) or ``Bt`` (1)."""
    if w.stacked is not None:
        return w.stacked[k][which][s, :r]
    table, width = (w.a_rows, w.in_features) if which == 0 else (w.b_rows, w.out_features[k])
    return gather_rank_rows(w.storage, table[k, s, :r], width)
