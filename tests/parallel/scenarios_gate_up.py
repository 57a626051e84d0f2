"""Rank-side half of test_gate_up_fold.py: a column-parallel gate/up shard with adapters,
through ``forward_silu_mul`` on the Triton kernels (CPU interpreter)."""

from __future__ import annotations

import os
from typing import Any

import torch

from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.layers.lora_linear import LoraStepContext
from dataplane.parallel import LAYOUT_LOCAL, LAYOUT_PAPER, ColumnParallelLinear, TPGroup


def run(group: TPGroup, p: dict[str, Any]) -> dict[str, Any]:
    os.environ["TRITON_INTERPRET"] = "1"
    from dataplane.kernels.triton import configs
    from dataplane.kernels.triton.backend import TritonLoraBackend

    # This process only: the fold for every step size (the committed table folds steps
    # above 1,024 rows; smaller ones take the fused launch).
    configs.FUSED_TABLE.clear()
    for t in configs.T_BUCKETS:
        configs.SILU_TABLE[t] = configs.default_expand(t, 64)
    inter, hidden = p["inter"], p["hidden"]
    out: dict[str, Any] = {}
    for layout in (LAYOUT_LOCAL, LAYOUT_PAPER):
        gu = ColumnParallelLinear(group, hidden, (inter, inter), ("gate_proj", "up_proj"))
        gu.load_global_weight(p["w_gu"])
        gu.enable_lora(layout, num_slots=p["num_slots"], max_rank=p["max_rank"])
        for slot, factors in p["adapters"].items():
            gu.load_adapter(slot, factors)
        backend = TritonLoraBackend(fused=True)
        folded: list[bool] = []
        fold = backend.add_lora_silu_mul

        def spy(*args: Any, fold: Any = fold, folded: list[bool] = folded) -> Any:
            act = fold(*args)
            folded.append(act is not None)
            return act

        backend.add_lora_silu_mul = spy  # type: ignore[method-assign]
        rows = p["x"].shape[0]
        meta = backend.build_meta(torch.tensor(p["row_slot"], dtype=torch.int32),
                                  LoraMetaBuffers(rows, p["num_slots"], "cpu"))
        ctx = LoraStepContext(backend, meta, LoraWorkspace(
            backend.workspace_numel(rows, 2, p["max_rank"]), "cpu"))
        group.counter.reset()
        out[layout] = {"act": gu.forward_silu_mul(p["x"], ctx), "folded": folded,
                       "lora_calls": group.counter.calls("lora")}
    return out
