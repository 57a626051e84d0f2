"""Rank-side half of test_gate_up_fold.py: this rank's column gate/up shard (a
`LoRALinear` at local sizes with its local factors) through ``forward_silu_mul``, on the
Triton kernels (CPU interpreter; the expand folds into SiLU·mul) and on the torch backend
(no such path: ``add_lora``, then the activation)."""

from __future__ import annotations

import os
from typing import Any

from dataplane.kernels import LoraBackend, get_lora_backend
from dataplane.parallel import COLUMN, TPGroup

from .rank_projection import attach_local_factors, column_shard, ledger, step_context


def run(group: TPGroup, p: dict[str, Any]) -> dict[str, Any]:
    os.environ["TRITON_INTERPRET"] = "1"
    from dataplane.kernels.triton import configs
    from dataplane.kernels.triton.backend import TritonLoraBackend

    # This process only: the fold for every step size (the committed table folds steps
    # above 1,024 rows; smaller ones take the fused launch).
    configs.FUSED_TABLE.clear()
    for t in configs.T_BUCKETS:
        configs.SILU_TABLE[t] = configs.default_expand(t, 64)
    inter = p["inter"]
    out: dict[str, Any] = {}
    backends: dict[str, LoraBackend] = {"triton": TritonLoraBackend(fused=True),
                                        "torch": get_lora_backend("cpu", prefer="torch")}
    for name, backend in backends.items():
        gu = column_shard(group, p["w_gu"], (inter, inter), ("gate_proj", "up_proj"))
        attach_local_factors(gu, group, p["adapters"], style=COLUMN,
                             num_slots=p["num_slots"], max_rank=p["max_rank"])
        folded: list[bool] = []
        fold = backend.add_lora_silu_mul

        def spy(*args: Any, fold: Any = fold, folded: list[bool] = folded) -> Any:
            act = fold(*args)
            folded.append(act is not None)
            return act

        backend.add_lora_silu_mul = spy  # type: ignore[method-assign]
        ctx = step_context(backend, p["row_slot"], p["num_slots"], p["max_rank"], 2)
        group.counter.reset()
        act = gu.forward_silu_mul(p["x"], ctx)
        out[name] = {"act": act, "folded": folded, "counts": ledger(group),
                     "local_widths": gu.out_features,
                     "base_act": gu.forward_silu_mul(p["x"], None)}
    return out
