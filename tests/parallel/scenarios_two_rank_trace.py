"""Rank-side half of the exact two-rank LoRA trace (see test_two_rank_trace.py)."""

from __future__ import annotations

from typing import Any

import torch

from dataplane.kernels import LoraMetaBuffers, LoraWorkspace, get_lora_backend
from dataplane.layers.lora_linear import LoraStepContext
from dataplane.parallel import (
    LAYOUT_LOCAL,
    LAYOUT_PAPER,
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
)

F16 = torch.float16


def _ctx(rows: int, slots: int, max_rank: int) -> LoraStepContext:
    backend = get_lora_backend("cpu")
    meta = backend.build_meta(torch.zeros(rows, dtype=torch.int32),
                              LoraMetaBuffers(rows, slots, "cpu"))
    ws = LoraWorkspace(backend.workspace_numel(rows, 3, max_rank), "cpu")
    return LoraStepContext(backend, meta, ws)


def run(group: TPGroup, p: dict[str, Any]) -> dict[str, Any]:
    t = lambda name: torch.tensor(p[name], dtype=F16)  # noqa: E731
    x, h = t("X"), t("H")
    a1, b1, w1 = t("A1").T, t("B1").T, t("W1")  # PEFT orientation: A [r, d_in], B [d_out, r]
    a2, b2, w2 = t("A2").T, t("B2").T, t("W2").T
    ctx = _ctx(x.shape[0], 1, 2)
    j, n = group.rank, group.size
    h_local = h[:, j * 4 // n:(j + 1) * 4 // n]
    out: dict[str, Any] = {}
    for layout in (LAYOUT_PAPER, LAYOUT_LOCAL):
        col = ColumnParallelLinear(group, 4, (4,), ("w1",), dtype=F16)
        col.load_global_weight(w1)
        qkv = ColumnParallelLinear(group, 4, (4, 4, 4), ("q", "k", "v"), dtype=F16)
        qkv.load_global_weight(torch.cat([w1, w1, w1]))
        row = RowParallelLinear(group, 4, 4, "w2", dtype=F16)
        row.load_global_weight(w2)
        for mod, factors in ((col, {0: (a1, b1, 1.0)}), (row, {0: (a2, b2, 1.0)}),
                             (qkv, {k: (a1, b1, 1.0) for k in range(3)})):
            mod.enable_lora(layout, num_slots=1, max_rank=2, bottleneck_dtype=F16)
            mod.load_adapter(0, factors)
        col.trace, row.trace = {}, {}
        group.counter.reset()
        col(x, ctx)
        row(h_local, ctx)
        first = {"calls": group.counter.calls(), "lora_calls": group.counter.calls("lora"),
                 "lora_ring_bytes": group.counter.ring_bytes("lora"),
                 "base_ring_bytes": group.counter.ring_bytes("base")}
        group.counter.reset()
        qkv(x, ctx)  # the paper's Q/K/V: three gathers' worth of bytes, fused into one call
        row(h_local, ctx)
        assert col.branch is not None and row.branch is not None
        out[layout] = {
            "col": {k: v.clone() for k, v in col.trace.items()},
            "row": {k: v.clone() for k, v in row.trace.items()},
            "first": first,
            "qkv_lora_calls": group.counter.calls("lora"),
            "qkv_lora_ring_bytes": group.counter.ring_bytes("lora"),
            "qkv_base_ring_bytes": group.counter.ring_bytes("base"),
            "resident_bytes": 2 * (col.branch.resident_scalars()
                                   + row.branch.resident_scalars()),
        }
    return out
