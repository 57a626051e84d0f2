"""Rank-side half of the exact two-rank LoRA trace (see test_two_rank_trace.py).

Each rank builds its shards as the engine does (ordinary `LoRALinear`s at local sizes
with local factors) and records what it computes: the bottleneck its backend's shrink
returns (`spy_shrink`), each projection's output with and without the adapter (their
difference is the rank's LoRA delta), the row stage's pre-reduce partial (`reduce`
unset) and the all-reduced output, and the collectives.
"""

from __future__ import annotations

from typing import Any

import torch

from dataplane.kernels.torch_backend import TorchLoraBackend
from dataplane.parallel import COLUMN, ROW, TPGroup

from .rank_projection import (
    attach_local_factors,
    column_shard,
    ledger,
    row_shard,
    spy_shrink,
    step_context,
)

F16 = torch.float16


def run(group: TPGroup, p: dict[str, Any]) -> dict[str, Any]:
    t = lambda name: torch.tensor(p[name], dtype=F16)  # noqa: E731
    x, h = t("X"), t("H")
    a1, b1, w1 = t("A1").T, t("B1").T, t("W1")  # PEFT orientation: A [r, d_in], B [d_out, r]
    a2, b2, w2 = t("A2").T, t("B2").T, t("W2").T
    j, n = group.rank, group.size
    h_local = h[:, j * 4 // n:(j + 1) * 4 // n].contiguous()
    # the loop path: its shrink returns the bottleneck z the spy records (the grouped path
    # of `add_lora` never materialises it)
    backend = TorchLoraBackend("loop")
    z: list[torch.Tensor] = []
    spy_shrink(backend, z)
    ctx = step_context(backend, [0] * x.shape[0], 1, 2)

    col = column_shard(group, w1, (4,), ("w1",), dtype=F16)
    scalars = attach_local_factors(col, group, {0: {0: (a1, b1, 1.0)}}, style=COLUMN,
                                   num_slots=1, max_rank=2)
    qkv = column_shard(group, torch.cat([w1, w1, w1]), (4, 4, 4), ("q", "k", "v"), dtype=F16)
    attach_local_factors(qkv, group, {0: {k: (a1, b1, 1.0) for k in range(3)}},
                         style=COLUMN, num_slots=1, max_rank=2)
    row = row_shard(group, w2, "w2", dtype=F16, reduce=False)
    scalars += attach_local_factors(row, group, {0: {0: (a2, b2, 1.0)}}, style=ROW,
                                    num_slots=1, max_rank=2)
    out: dict[str, Any] = {"resident_bytes": 2 * scalars}

    group.counter.reset()
    out["col_output"] = col(x, ctx)
    out["col_z"] = z.pop()[0, :, 0, :]  # torch: one split; [T, R] of slice 0
    out["col_base"] = col(x, None)
    out["qkv_output"] = qkv(x, ctx)
    out["qkv_z"] = z.pop()[0]  # [T, 3 slices, R]
    out["row_partial"] = row(h_local, ctx)  # x_j W_j^T + (x_j A_j^T) B^T, before the sum
    out["row_z"] = z.pop()[0, :, 0, :]
    out["row_base_partial"] = row(h_local, None)
    out["partials_counts"] = ledger(group)  # none of the above sends anything

    row.reduce = group
    group.counter.reset()
    out["col_output_2"] = col(x, ctx)
    out["y"] = row(h_local, ctx)
    out["counts"] = ledger(group)  # column then row stage, as in a layer
    group.counter.reset()
    out["y_base"] = row(h_local, None)
    out["base_counts"] = ledger(group)
    out["late_shrinks"] = len(z)  # one per adapted forward: col, then row
    return out
