"""Per-module choice of LoRA layout under TP: resident bytes versus collective calls.

Both layouts give the same global update; they differ in two ledgers:

* paper: 1 extra collective per projection per forward (all-gather of the rank-sliced
  bottleneck for column-parallel, all-reduce of the bottleneck partials for row-parallel),
  fully sharded factors.
* no_extra_collectives: no extra call; the factor the paper shards on the rank axis
  (column: A) or the output axis (row: B) is replicated, costing
  ``(N-1)/N`` of that factor in resident bytes and in HBM reads per active adapter.

Estimated extra step time of each layout (seconds, per forward of one module):

    paper  = calls * SMALL_COLLECTIVE_S + ring_bytes / NVLINK_BYTES_PER_S
    local  = extra_factor_bytes(active adapters) / HBM_BYTES_PER_S
             (+ row-parallel: the full-width expand writes (N-1)/N * T*d_out more)

The layout with the smaller time wins, unless replication would exceed the per-rank
byte budget for extra residency (then paper), or the rank does not split over N
(column paper impossible: then no_extra_collectives). Ties go to no_extra_collectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dataplane.parallel.shard import (
    COLUMN,
    LAYOUT_LOCAL,
    LAYOUT_PAPER,
    check_style_layout,
)

SMALL_COLLECTIVE_S = 37.5e-6
"""What one extra small NCCL collective adds to a step on two NVLink-connected H200s
(multicast off): 35–40 µs whatever its size; the constant is the midpoint. Inside a replayed
decode graph the all-reduce kernel itself takes under 10 µs, but each extra call also brings
the bottleneck's assembly and the launches around it, so the paper layout's 128 extra calls
per decode step cost 4.5–5.1 ms end to end: the constant stands for what a call adds, not
for the kernel (measured: docs/PERFORMANCE.md, "Tensor parallel")."""
NVLINK_BYTES_PER_S = 450e9
"""H200 SXM NVLink 4: 900 GB/s bidirectional per GPU (NVIDIA H200 datasheet) -> 450 GB/s
one direction, the rate a ring step moves bytes."""
HBM_BYTES_PER_S = 4073e9
"""H200 device copy bandwidth as a plain copy reaches it (spec 4.8 TB/s; measured:
docs/PERFORMANCE.md, "Engine")."""


@dataclass(frozen=True)
class ModuleTraffic:
    """What the cost model needs to know about one projection and its workload.

    `d_in`/`d_out` global (d_out summed over fused slices), `num_slices` fused slices,
    `rank` the adapters' (max) rank, `tokens` rows per step, `active_adapters` distinct
    adapters in a step, `resident_adapters` adapters kept loaded, `dtype_bytes` of factors
    and activations, `bottleneck_bytes` per element on the wire (float32: 4).
    """

    style: str
    d_in: int
    d_out: int
    num_slices: int
    rank: int
    tp_size: int
    tokens: int
    active_adapters: int
    resident_adapters: int
    dtype_bytes: int = 2
    bottleneck_bytes: int = 4


@dataclass(frozen=True)
class LayoutDecision:
    layout: str
    reason: str
    paper_extra_calls: int
    paper_ring_bytes: Fraction
    paper_time_s: float
    local_time_s: float
    local_extra_resident_bytes: Fraction


def paper_ring_bytes(m: ModuleTraffic) -> Fraction:
    """Logical per-rank bytes of the paper schedule's extra collective."""
    n = m.tp_size
    if m.style == COLUMN:  # all-gather of [T, NS, r]: (N-1) T NS r / N
        return Fraction((n - 1) * m.tokens * m.num_slices * m.rank * m.bottleneck_bytes, n)
    return Fraction(2 * (n - 1) * m.tokens * m.rank * m.bottleneck_bytes, n)


def local_extra_resident_bytes(m: ModuleTraffic) -> Fraction:
    """Per-rank bytes the replicated factor adds over the fully sharded paper layout."""
    n = m.tp_size
    replicated = m.rank * (m.d_in if m.style == COLUMN else m.d_out)
    return Fraction((n - 1) * replicated * m.dtype_bytes * m.resident_adapters, n)


def decide_layout(m: ModuleTraffic, *, extra_resident_budget_bytes: int | None = None
                  ) -> LayoutDecision:
    """Pick the layout of one module (see module docstring for the rule)."""
    check_style_layout(m.style, LAYOUT_LOCAL)
    n = m.tp_size
    ring = paper_ring_bytes(m) if n > 1 else Fraction(0)
    calls = 1 if n > 1 else 0
    paper_s = calls * SMALL_COLLECTIVE_S + float(ring) / NVLINK_BYTES_PER_S
    replicated = m.rank * (m.d_in if m.style == COLUMN else m.d_out)
    extra_read = Fraction((n - 1) * replicated * m.dtype_bytes * m.active_adapters, n)
    if m.style != COLUMN:
        extra_read += Fraction(2 * (n - 1) * m.tokens * m.d_out * m.dtype_bytes, n)
    local_s = float(extra_read) / HBM_BYTES_PER_S
    resident = local_extra_resident_bytes(m)

    def pick(layout: str, reason: str) -> LayoutDecision:
        check_style_layout(m.style, layout)
        return LayoutDecision(layout, reason, calls, ring, paper_s, local_s, resident)

    if n == 1:
        return pick(LAYOUT_LOCAL, "tp_size 1: nothing to shard")
    if m.style == COLUMN and m.rank % n:
        return pick(LAYOUT_LOCAL, "rank does not split over the TP degree")
    if extra_resident_budget_bytes is not None and resident > extra_resident_budget_bytes:
        return pick(LAYOUT_PAPER, "replication exceeds the resident-bytes budget")
    if paper_s < local_s:
        return pick(LAYOUT_PAPER, "collective cheaper than replicated reads")
    return pick(LAYOUT_LOCAL, "replicated reads cheaper than an extra collective")
