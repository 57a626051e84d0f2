"""Slicing global weights and PEFT factors into one TP rank's local tensors.

Orientation: factors are in PEFT/checkpoint orientation, A ``[r, d_in]``,
B ``[d_out, r]``, delta ``= scale * X A^T B^T``; S-LoRA's ``A``/``B`` are their transposes.
Rank ``j`` of ``N`` owns the half-open interval ``[j*n/N, (j+1)*n/N)`` of a sharded axis of
length ``n`` (contiguous, even; an indivisible axis is refused, never padded). Replicated
units (k/v heads when there are fewer kv heads ``u`` than ranks, ``N % u == 0``): rank ``j``
owns unit ``j*u // N`` whole, shared by ``N/u`` ranks (as vLLM replicates kv heads).

Base projections (Megatron):
    column-parallel (q/k/v, gate/up): W ``[d_out, d_in]`` output-sharded, each fused
        slice sharded separately (GQA: k/v sharded on kv-head boundaries, replicated
        when the ranks outnumber the kv heads);
    row-parallel (o, down): W input-sharded; partial outputs are summed by all-reduce.

LoRA factors (the one layout; no collective beyond the base path's, dataplane/parallel/
shard_model.py):

    style   A on rank j                 B on rank j
    column  whole [r, d_in]             rows (output) shard, like the base slice
    row     columns (input) shard       whole [d_out, r]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dataplane.parallel.errors import IndivisibleShardError, ShardShapeError, UnknownLayoutError

COLUMN = "column"
ROW = "row"
STYLES = (COLUMN, ROW)


def check_style(style: str) -> None:
    if style not in STYLES:
        raise UnknownLayoutError(f"unknown parallel style {style!r}; known {STYLES}")


def replicates(n: int, tp_size: int, unit: int) -> bool:
    """True iff an axis of `n` elements in units of `unit` has fewer units than ranks and
    each unit can be shared by the same number of ranks (``tp_size % units == 0``)."""
    units = n // unit if unit >= 1 and n % unit == 0 else 0
    return 0 < units < tp_size and tp_size % units == 0


def shard_interval(n: int, tp_rank: int, tp_size: int, *, what: str, unit: int = 1,
                   replicate: bool = False) -> tuple[int, int]:
    """``[start, stop)`` of rank `tp_rank` on an axis of `n` elements in blocks of `unit`.

    `unit` keeps shards on whole heads (head_dim) for q/k/v. With `replicate`, an axis of
    fewer units than ranks gives rank j the whole unit ``j * units // tp_size``
    (`replicates`). Otherwise raises when `n / unit` is not divisible by `tp_size`.
    """
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise IndivisibleShardError(f"{what}: rank {tp_rank} outside a group of {tp_size}")
    if replicate and replicates(n, tp_size, unit):
        j = tp_rank * (n // unit) // tp_size
        return j * unit, (j + 1) * unit
    if unit < 1 or n % unit or (n // unit) % tp_size:
        raise IndivisibleShardError(
            f"{what}: {n} elements in units of {unit} do not split over {tp_size} ranks")
    size = n // tp_size
    return tp_rank * size, (tp_rank + 1) * size


def shard_column_weight(weight: torch.Tensor, widths: Sequence[int], tp_rank: int,
                        tp_size: int, units: Sequence[int] | None = None,
                        replicate: Sequence[bool] | None = None) -> torch.Tensor:
    """Local rows of a fused column-parallel weight ``[sum(widths), d_in]`` (or a bias
    ``[sum(widths)]``): every slice sharded separately (`replicate[k]`: slice k's units may
    be replicated, `shard_interval`), local slices concatenated in order.
    """
    if weight.shape[0] != sum(widths):
        raise ShardShapeError(f"weight has {weight.shape[0]} rows, slices sum to {sum(widths)}")
    units = tuple(units) if units is not None else (1,) * len(widths)
    reps = tuple(replicate) if replicate is not None else (False,) * len(widths)
    if len(units) != len(widths) or len(reps) != len(widths):
        raise ShardShapeError("one unit per slice")
    parts, offset = [], 0
    for k, (w, u, rep) in enumerate(zip(widths, units, reps, strict=True)):
        lo, hi = shard_interval(w, tp_rank, tp_size, what=f"slice {k}", unit=u, replicate=rep)
        parts.append(weight[offset + lo: offset + hi])
        offset += w
    return torch.cat(parts, 0).contiguous()


def shard_row_weight(weight: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """Local input columns of a row-parallel weight ``[d_out, d_in]``."""
    if weight.dim() != 2:
        raise ShardShapeError(f"row-parallel weight must be 2-D, got {list(weight.shape)}")
    lo, hi = shard_interval(weight.shape[1], tp_rank, tp_size, what="row-parallel input")
    return weight[:, lo:hi].contiguous()


@dataclass(frozen=True)
class LocalFactors:
    """One module's factors on one rank (PEFT orientation): `a` ``[r, d_in_local]``, `b`
    ``[d_out_local, r]``; `scale` unchanged by sharding."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float


def shard_lora_factors(a: torch.Tensor, b: torch.Tensor, scale: float, *, style: str,
                       tp_rank: int, tp_size: int, out_unit: int = 1,
                       out_replicate: bool = False) -> LocalFactors:
    """Slice one global PEFT factor pair (A ``[r, d_in]``, B ``[d_out, r]``) for one rank.

    Column styles shard B's output rows like the base slice (`out_unit`: head_dim for
    q/k/v; `out_replicate` for k/v heads shared by several ranks); row styles shard A's
    input columns like the base weight. Shapes are checked before any slicing; the result
    is contiguous and independent of the inputs.
    """
    check_style(style)
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or a.shape[0] < 1:
        raise ShardShapeError(f"A {list(a.shape)} / B {list(b.shape)} are not [r, d_in] / "
                              "[d_out, r]")
    if style == COLUMN:
        lo, hi = shard_interval(b.shape[0], tp_rank, tp_size, what="LoRA B output",
                                unit=out_unit, replicate=out_replicate)
        a_local, b_local = a, b[lo:hi]
    else:
        lo, hi = shard_interval(a.shape[1], tp_rank, tp_size, what="LoRA A input")
        a_local, b_local = a[:, lo:hi], b
    return LocalFactors(a_local.contiguous().clone(), b_local.contiguous().clone(),
                        float(scale))
