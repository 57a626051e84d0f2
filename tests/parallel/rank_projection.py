"""What the layer-level TP scenarios share: one rank's shard of a projection as the
ordinary `LoRALinear` at its local sizes, its adapters' local factors in a
`LoraFactorTable`, and a step context.

    column  rows of every fused slice of W (`shard_column_weight`); A whole, B rows like
            the base slice (`shard_lora_factors`, style COLUMN); no collective
    row     input columns of W (`shard_row_weight`); A input columns, B whole (style ROW);
            `reduce` set: one "base" all-reduce of base + LoRA partials, then the bias
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from dataplane.kernels import LoraBackend, LoraFactorTable, LoraMetaBuffers, LoraWorkspace
from dataplane.layers.lora_linear import LoRALinear, LoraStepContext
from dataplane.parallel import TPGroup
from dataplane.parallel.shard import shard_column_weight, shard_lora_factors, shard_row_weight

Factors = tuple[torch.Tensor, torch.Tensor, float]
"""Global PEFT factors of one slice: A ``[r, d_in]``, B ``[d_out, r]``, scale."""


def column_shard(group: TPGroup, weight: torch.Tensor, widths: Sequence[int],
                 names: tuple[str, ...], *, units: Sequence[int] | None = None,
                 replicate: Sequence[bool] | None = None, dtype: torch.dtype = torch.float32
                 ) -> LoRALinear:
    """This rank's column shard of the fused global `weight` ``[sum(widths), d_in]``."""
    local = shard_column_weight(weight, widths, group.rank, group.size, units, replicate)
    lin = LoRALinear(weight.shape[1], names, local_widths(widths, group, units, replicate),
                     bias=False, dtype=dtype, device=group.device)
    with torch.no_grad():
        lin.weight.copy_(local)
    return lin


def local_widths(widths: Sequence[int], group: TPGroup, units: Sequence[int] | None,
                 replicate: Sequence[bool] | None) -> tuple[int, ...]:
    """Each slice's local width: ``w / N``, or one unit where the units are replicated."""
    out = []
    for k, w in enumerate(widths):
        unit = 1 if units is None else units[k]
        shared = replicate is not None and replicate[k] and w // unit < group.size
        out.append(unit if shared else w // group.size)
    return tuple(out)


def row_shard(group: TPGroup, weight: torch.Tensor, name: str, *,
              bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
              reduce: bool = True) -> LoRALinear:
    """This rank's row shard of the global `weight` ``[d_out, d_in]`` (`reduce` False: the
    rank's partial output, no all-reduce, no bias)."""
    local = shard_row_weight(weight, group.rank, group.size)
    lin = LoRALinear(local.shape[1], (name,), (weight.shape[0],), bias=bias is not None,
                     dtype=dtype, device=group.device)
    with torch.no_grad():
        lin.weight.copy_(local)
        if bias is not None and lin.bias is not None:
            lin.bias.copy_(bias)
    lin.reduce = group if reduce else None
    return lin


def attach_local_factors(lin: LoRALinear, group: TPGroup,
                         adapters: Mapping[int, Mapping[int, Factors]], *, style: str,
                         num_slots: int, max_rank: int,
                         units: Sequence[int] | None = None,
                         replicate: Sequence[bool] | None = None) -> int:
    """Shard every slot's global factors for this rank (`shard_lora_factors`, `style`
    COLUMN or ROW), load them into a fresh stacked table attached to `lin`; returns the
    local factor scalars."""
    table = LoraFactorTable(num_slots, lin.in_features, lin.out_features, max_rank,
                            lin.weight.dtype, lin.weight.device)
    scalars, adapted = 0, False
    for slot, per_slice in adapters.items():
        local = {}
        for k, (a, b, scale) in per_slice.items():
            f = shard_lora_factors(
                a.to(lin.weight.dtype), b.to(lin.weight.dtype), scale, style=style,
                tp_rank=group.rank, tp_size=group.size,
                out_unit=1 if units is None else units[k],
                out_replicate=replicate is not None and replicate[k])
            local[k] = (f.a, f.b, f.scale)
            scalars += f.a.numel() + f.b.numel()
        if local:
            table.set_slot(slot, local)
            adapted = True
    lin.attach_factors(table)
    lin.set_adapted(adapted)
    return scalars


def step_context(backend: LoraBackend, row_slot: Sequence[int], num_slots: int,
                 max_rank: int, max_slices: int = 3) -> LoraStepContext:
    """One step's `LoraStepContext` on the CPU for rows of slots `row_slot` (-1: base)."""
    rows = len(row_slot)
    meta = backend.build_meta(torch.tensor(list(row_slot), dtype=torch.int32),
                              LoraMetaBuffers(rows, num_slots, "cpu"))
    return LoraStepContext(backend, meta, LoraWorkspace(
        backend.workspace_numel(rows, max_slices, max_rank), "cpu"))


def spy_shrink(backend: LoraBackend, into: list[torch.Tensor]) -> None:
    """Record (a copy of) every bottleneck ``z [splits, T, NS, R]`` the backend's shrink
    returns: the LoRA intermediate the rank actually computes."""
    shrink: Callable[..., torch.Tensor] = backend.shrink

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        z = shrink(*args, **kwargs)
        into.append(z.clone())
        return z

    backend.shrink = spy  # type: ignore[method-assign]


def ledger(group: TPGroup) -> dict[str, Any]:
    """The collective ledgers since the last reset, by purpose."""
    c = group.counter
    return {"calls": c.calls(), "base_calls": c.calls("base"), "lora_calls": c.calls("lora"),
            "base_all_reduce": c.calls("base", "all_reduce"),
            "base_ring_bytes": c.ring_bytes("base"), "lora_ring_bytes": c.ring_bytes("lora"),
            "base_payload_bytes": c.payload_bytes("base")}
