# mypy: disable-error-code="no-untyped-def"
"""Triton RMSNorm / fused residual-add + RMSNorm (contract: dataplane/ops/rms_norm.py).

One program per row; the row must fit one block (hidden <= MAX_BLOCK). fp32 statistics;
the normalised row is rounded to the activation dtype before the weight multiply (HF).
``FOLD``: the row first gets its folded LoRA expand (dataplane/ops/lora_fold.py: the o or
down projection's output, after its all-reduce), rounded to the dtype.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dataplane.intmath import next_pow2
from dataplane.ops.errors import OpsError
from dataplane.ops.lora_fold import FoldedExpand
from dataplane.ops.triton.fold_delta import fold_delta
from dataplane.triton_launch import LaunchPlan

MAX_BLOCK = 65536


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, z_ptr, slot_ptr, b_ptr, scale_ptr,
                     stride_x, stride_r, stride_o, stride_z, n_cols, eps, BLOCK: tl.constexpr,
                     ADD_RESIDUAL: tl.constexpr, FOLD: tl.constexpr, R: tl.constexpr,
                     RC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = out_ptr.dtype.element_ty
    if FOLD:
        slot = tl.load(slot_ptr + row)
        x = (x.to(tl.float32) + fold_delta(z_ptr, b_ptr, scale_ptr, slot, 0, cols, mask,
                                           stride_z, row, n_cols, 1, R, RC)).to(dtype)
    if ADD_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # the dtype add of HF
        tl.store(res_ptr + row * stride_r + cols, s, mask=mask)
        x = s
    h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (h * rstd).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * stride_o + cols, y.to(dtype), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> int:
    if x.dim() != 2 or x.stride(1) != 1 or weight.dim() != 1 or not weight.is_contiguous() \
            or weight.shape[0] != x.shape[1] or weight.dtype != x.dtype \
            or weight.device != x.device:
        raise OpsError("rms_norm: want x [T, N] (unit column stride), weight [N] same dtype",
                       x=tuple(x.shape), weight=tuple(weight.shape))
    if residual is not None and (residual.shape != x.shape or residual.stride(1) != 1
                                 or residual.dtype != x.dtype or residual.device != x.device):
        raise OpsError("fused_add_rms_norm: residual must match x", x=tuple(x.shape),
                       residual=tuple(residual.shape))
    block = next_pow2(x.shape[1])
    if block > MAX_BLOCK:
        raise OpsError("rms_norm: hidden size too large for one block", hidden=x.shape[1])
    return block


FOLD_RC = 8  # rank rows of B per load when the LoRA expand is folded in
FOLD_NUM_WARPS = 16


@functools.lru_cache(maxsize=256)
def _plan(block: int, add_residual: bool, rank: int, ints: tuple[int, ...]) -> LaunchPlan:
    """One plan per value of the specialized integer arguments (strides, width)."""
    r = max(rank, 1)
    warps = min(16, max(1, block // 256))
    return LaunchPlan(_rms_norm_kernel, dict(BLOCK=block, ADD_RESIDUAL=add_residual,
                                             FOLD=rank > 0, R=r, RC=min(r, FOLD_RC),
                                             num_warps=FOLD_NUM_WARPS if rank else warps))


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            out: torch.Tensor, eps: float, block: int, fold: FoldedExpand | None = None,
            tail: torch.Tensor | None = None) -> None:
    if x.shape[0] == 0:
        return
    res = residual if residual is not None else x
    if fold is None or tail is None:
        z, slot, b, scale, rank = x, x, x, x, 0
    else:
        fold.check(tail, (x.shape[1],))
        z, slot, b, scale, rank = tail, fold.row_slot, fold.b[0], fold.scale, fold.rank
    ints = (x.stride(0), res.stride(0), out.stride(0), z.stride(0), x.shape[1])
    _plan(block, residual is not None, rank, ints)(
        (x.shape[0],), x, res, weight, out, z, slot, b, scale, *ints, float(eps))


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    block = _check(x, weight, None)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, None, weight, out, eps, block)
    return out


def fused_add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                              eps: float, fold: FoldedExpand | None = None,
                              tail: torch.Tensor | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual <- x (+ folded LoRA) + residual, x <- RMSNorm(residual); returns
    (x, residual)."""
    block = _check(x, weight, residual)
    _launch(x, residual, weight, x, eps, block, fold, tail)
    return x, residual
