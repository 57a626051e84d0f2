# mypy: disable-error-code="no-untyped-def"
"""Triton SiLU(gate) * up (contract: dataplane/ops/silu_mul.py). Grid (T, cdiv(I, BLOCK));
fp32 math, one rounding to the input dtype. ``FOLD``: gate and up first get their row's
folded LoRA expand (dataplane/ops/lora_fold.py), each rounded to the dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dataplane.intmath import cdiv, next_pow2
from dataplane.ops.errors import OpsError
from dataplane.ops.lora_fold import FoldedExpand
from dataplane.ops.triton.fold_delta import fold_delta
from dataplane.triton_launch import cached_plan

BLOCK = 1024
FOLD_BLOCK = 1024  # columns per program when the LoRA expand is folded in
FOLD_NUM_WARPS = 4
FOLD_RC = 16  # rank rows of B per load


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, z_ptr, slot_ptr, bg_ptr, bu_ptr, scale_ptr,
                     stride_x, stride_o, stride_z, inter, BLOCK: tl.constexpr,
                     FOLD: tl.constexpr, R: tl.constexpr, RC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    if FOLD:
        slot = tl.load(slot_ptr + row)
        dt = x_ptr.dtype.element_ty
        g = (g + fold_delta(z_ptr, bg_ptr, scale_ptr, slot, 0, cols, mask, stride_z, row,
                            inter, 2, R, RC)).to(dt).to(tl.float32)
        u = (u + fold_delta(z_ptr, bu_ptr, scale_ptr, slot, 1, cols, mask, stride_z, row,
                            inter, 2, R, RC)).to(dt).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(gate_up: torch.Tensor, fold: FoldedExpand | None = None,
                        tail: torch.Tensor | None = None) -> torch.Tensor:
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise OpsError("silu_and_mul: want [T, 2I] with unit column stride",
                       shape=tuple(gate_up.shape))
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    if rows and inter:
        block = min(BLOCK if fold is None else FOLD_BLOCK, next_pow2(inter))
        if fold is None or tail is None:
            z, slot, bg, bu, scale, r, sz = gate_up, gate_up, gate_up, gate_up, gate_up, 0, 0
        else:
            fold.check(tail, (inter, inter))
            z, slot, (bg, bu), scale = tail, fold.row_slot, fold.b, fold.scale
            r, sz = fold.rank, tail.stride(0)
        ints = (gate_up.stride(0), out.stride(0), sz, inter)
        cached_plan(_silu_mul_kernel, (*ints, block, r, FOLD_NUM_WARPS, FOLD_RC),
                    dict(BLOCK=block, FOLD=r > 0, R=max(r, 1), RC=min(max(r, 1), FOLD_RC),
                         num_warps=FOLD_NUM_WARPS if r else 4))(
            (rows, cdiv(inter, block)), gate_up, out, z, slot, bg, bu, scale, *ints)
    return out
