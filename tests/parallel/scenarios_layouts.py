"""Rank-side half of test_lora_layouts.py: GQA q/k/v (column) and o (row) with adapters."""

from __future__ import annotations

import os
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


def _counts(group: TPGroup) -> dict[str, Any]:
    c = group.counter
    return {"base_calls": c.calls("base"), "lora_calls": c.calls("lora"),
            "base_ring_bytes": c.ring_bytes("base"), "lora_ring_bytes": c.ring_bytes("lora"),
            "base_payload_bytes": c.payload_bytes("base")}


def run_case(group: TPGroup, p: dict[str, Any], layout: str, backend_name: str
             ) -> dict[str, Any]:
    hd, hidden = p["head_dim"], p["hidden"]
    widths = (p["heads"] * hd, p["kv_heads"] * hd, p["kv_heads"] * hd)
    qkv = ColumnParallelLinear(group, hidden, widths, ("q_proj", "k_proj", "v_proj"),
                               units=(hd, hd, hd))
    qkv.load_global_weight(p["w_qkv"])
    o = RowParallelLinear(group, widths[0], hidden, "o_proj", bias=True)
    o.load_global_weight(p["w_o"], p["b_o"])
    for mod, name in ((qkv, "qkv"), (o, "o")):
        mod.enable_lora(layout, num_slots=p["num_slots"], max_rank=p["max_rank"])
        for slot, per_module in p["adapters"].items():
            if name in per_module:
                mod.load_adapter(slot, per_module[name])
    if backend_name == "triton":  # the GPU kernels, through Triton's CPU interpreter
        os.environ["TRITON_INTERPRET"] = "1"
    backend = get_lora_backend("cpu", prefer=backend_name)
    rows = p["x"].shape[0]
    meta = backend.build_meta(torch.tensor(p["row_slot"], dtype=torch.int32),
                              LoraMetaBuffers(rows, p["num_slots"], "cpu"))
    ctx = LoraStepContext(backend, meta, LoraWorkspace(
        backend.workspace_numel(rows, 3, p["max_rank"]), "cpu"))
    lo, hi = o.global_in_features * group.rank // group.size, \
        o.global_in_features * (group.rank + 1) // group.size
    out: dict[str, Any] = {}
    for label, lora in (("lora", ctx), ("base", None)):
        group.counter.reset()
        out[f"qkv_{label}"] = qkv(p["x"], lora)
        out[f"qkv_{label}_counts"] = _counts(group)
        group.counter.reset()
        out[f"o_{label}"] = o(p["x_o"][:, lo:hi].contiguous(), lora)
        out[f"o_{label}_counts"] = _counts(group)
    assert qkv.branch is not None and o.branch is not None
    out["resident_scalars"] = qkv.branch.resident_scalars() + o.branch.resident_scalars()
    return out


def run(group: TPGroup, p: dict[str, Any]) -> dict[tuple[tuple[str, str], str], Any]:
    """Every (payload, backend) case of `p["cases"]` in both layouts."""
    return {((case, backend), layout): run_case(group, p["payloads"][case], layout, backend)
            for case, backend in p["cases"] for layout in (LAYOUT_LOCAL, LAYOUT_PAPER)}
