# mypy: disable-error-code="no-untyped-def"
"""Triton SiLU(gate) * up (contract: dataplane/ops/silu_mul.py). Grid (T, cdiv(I, BLOCK));
fp32 math, one rounding to the input dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dataplane.intmath import cdiv, next_pow2
from dataplane.ops.errors import OpsError
from dataplane.triton_launch import cached_plan

BLOCK = 1024


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise OpsError("silu_and_mul: want [T, 2I] with unit column stride",
                       shape=tuple(gate_up.shape))
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    if rows and inter:
        block = min(BLOCK, next_pow2(inter))
        ints = (gate_up.stride(0), out.stride(0), inter)
        cached_plan(_silu_mul_kernel, (*ints, block), dict(BLOCK=block, num_warps=4))(
            (rows, cdiv(inter, block)), gate_up, out, *ints)
    return out
