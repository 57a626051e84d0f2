# mypy: disable-error-code="no-untyped-def"
"""Triton RMSNorm / fused residual-add + RMSNorm (contract: dataplane/ops/rms_norm.py).

One program per row; the row must fit one block (hidden <= MAX_BLOCK). fp32 statistics;
the normalised row is rounded to the activation dtype before the weight multiply (HF).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dataplane.intmath import next_pow2
from dataplane.ops.errors import OpsError
from dataplane.triton_launch import LaunchPlan

MAX_BLOCK = 65536


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, stride_x, stride_r, stride_o, n_cols,
                     eps, BLOCK: tl.constexpr, ADD_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = out_ptr.dtype.element_ty
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


@functools.lru_cache(maxsize=256)
def _plan(block: int, add_residual: bool, ints: tuple[int, ...]) -> LaunchPlan:
    """One plan per value of the specialized integer arguments (strides, width)."""
    return LaunchPlan(_rms_norm_kernel, dict(BLOCK=block, ADD_RESIDUAL=add_residual,
                                             num_warps=min(16, max(1, block // 256))))


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            out: torch.Tensor, eps: float, block: int) -> None:
    if x.shape[0] == 0:
        return
    res = residual if residual is not None else x
    ints = (x.stride(0), res.stride(0), out.stride(0), x.shape[1])
    _plan(block, residual is not None, ints)(
        (x.shape[0],), x, res, weight, out, *ints, float(eps))


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    block = _check(x, weight, None)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, None, weight, out, eps, block)
    return out


def fused_add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual <- x + residual, x <- RMSNorm(residual); returns (x, residual)."""
    block = _check(x, weight, residual)
    _launch(x, residual, weight, x, eps, block)
    return x, residual
