"""RMSNorm and fused residual-add + RMSNorm (vLLM's `fused_add_rms_norm`), HF numerics.

    rms_norm(x, w):                y = w * (x / sqrt(mean(x^2) + eps)).to(dtype)
    fused_add_rms_norm(x, r, w):   r' = x + r (rounded to dtype);  y = rms_norm(r', w)

Statistics in fp32, the normalised row rounded to the activation dtype before the weight
multiply, exactly as HF `LlamaRMSNorm` computes it.

Contract: x [T, N] (unit column stride, any row stride), residual [T, N] likewise, weight
[N] contiguous, all one dtype and device. The Triton `fused_add_rms_norm`
(ops/triton/rms_norm.py, one program per row) writes r' into `residual` and y into `x` (in
place: no allocation, CUDA-graph safe); the torch reference returns new tensors. Callers
use the returned `(y, r')` and never the inputs afterwards.
"""

from __future__ import annotations

import torch

from dataplane.ops.backend import use_triton
from dataplane.ops.lora_fold import FoldedExpand, add_folded


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Reference (HF LlamaRMSNorm): fp32 statistics, result in x's dtype."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             backend: str = "auto") -> torch.Tensor:
    """y [T, N] = RMSNorm(x) in x's dtype (a new tensor; x is not modified)."""
    if not use_triton(x, backend):
        return rms_norm_torch(x, weight, eps)
    from dataplane.ops.triton.rms_norm import rms_norm_triton

    return rms_norm_triton(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float, backend: str = "auto", fold: FoldedExpand | None = None,
                       tail: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual); Triton: in place (see module docstring).
    With `fold` and `tail` (the projection's z columns, dataplane/ops/lora_fold.py) x
    first gets each row's LoRA expand, rounded to the dtype."""
    if not use_triton(x, backend):
        if fold is not None and tail is not None:
            fold.check(tail, (x.shape[1],))
            x = add_folded(x, tail, fold, 0)
        summed = x + residual
        return rms_norm_torch(summed, weight, eps), summed
    from dataplane.ops.triton.rms_norm import fused_add_rms_norm_triton

    return fused_add_rms_norm_triton(x, residual, weight, eps, fold, tail)
