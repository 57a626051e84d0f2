"""Rank-side half of test_lora_shards.py: this rank's GQA q/k/v column shard and o row
shard as `LoRALinear`s at local sizes, with the adapters' local factors."""

from __future__ import annotations

import os
from typing import Any

from dataplane.kernels import get_lora_backend
from dataplane.parallel import COLUMN, ROW, TPGroup

from .rank_projection import (
    attach_local_factors,
    column_shard,
    ledger,
    row_shard,
    step_context,
)


def run_case(group: TPGroup, p: dict[str, Any], backend_name: str) -> dict[str, Any]:
    hd = p["head_dim"]
    widths = (p["heads"] * hd, p["kv_heads"] * hd, p["kv_heads"] * hd)
    units, rep = (hd, hd, hd), (False, True, True)  # k/v heads may be shared by ranks
    qkv = column_shard(group, p["w_qkv"], widths, ("q_proj", "k_proj", "v_proj"),
                       units=units, replicate=rep)
    o = row_shard(group, p["w_o"], "o_proj", bias=p["b_o"])
    slots, max_rank = p["num_slots"], p["max_rank"]
    scalars = attach_local_factors(
        qkv, group, {s: a.get("qkv", {}) for s, a in p["adapters"].items()}, style=COLUMN,
        num_slots=slots, max_rank=max_rank, units=units, replicate=rep)
    scalars += attach_local_factors(
        o, group, {s: a.get("o", {}) for s, a in p["adapters"].items()}, style=ROW,
        num_slots=slots, max_rank=max_rank)
    if backend_name == "triton":  # the GPU kernels, through Triton's CPU interpreter
        os.environ["TRITON_INTERPRET"] = "1"
    backend = get_lora_backend("cpu", prefer=backend_name)
    assert backend.name == backend_name
    ctx = step_context(backend, p["row_slot"], slots, max_rank)
    lo, hi = widths[0] * group.rank // group.size, widths[0] * (group.rank + 1) // group.size
    x_o = p["x_o"][:, lo:hi].contiguous()
    out: dict[str, Any] = {"resident_scalars": scalars}
    for label, lora in (("lora", ctx), ("base", None)):
        group.counter.reset()
        out[f"qkv_{label}"] = qkv(p["x"], lora)
        out[f"qkv_{label}_counts"] = ledger(group)
        group.counter.reset()
        out[f"o_{label}"] = o(x_o, lora)
        out[f"o_{label}_counts"] = ledger(group)
    return out


def run(group: TPGroup, p: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """Every (payload, backend) case of `p["cases"]`."""
    return {(case, backend): run_case(group, p["payloads"][case], backend)
            for case, backend in p["cases"]}
