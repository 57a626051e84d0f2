# mypy: disable-error-code="no-untyped-def"
"""The folded LoRA expand of one row and column block (dataplane/ops/lora_fold.py), a
device function the consumer kernels (RMSNorm, SiLU·mul, RoPE) inline."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fold_delta(z_ptr, b_ptr, scale_ptr, slot, k, cols, mask, stride_zt, row, stride_br,
               NUM_SLICES: tl.constexpr, R: tl.constexpr, RC: tl.constexpr):
    """float32 ``scale[slot, k] * sum_i z[row, slot*C + k*R + i] * B_k[slot, i, cols]``
    (B_k contiguous [H, R, w_k]: row stride `stride_br` = w_k), `RC` rank rows of B per
    2-D load (R a multiple of RC). Branch-free: a row without a slot (`slot` < 0) loads
    nothing and gets 0, so the loads issue as early as the caller's own."""
    r_live = R * (slot >= 0).to(tl.int32)  # rank rows to load: R, or 0 without a slot
    slot64 = tl.maximum(slot, 0).to(tl.int64)
    z_row = z_ptr + row * stride_zt + slot64 * (NUM_SLICES * R) + k * R
    base = b_ptr + slot64 * (R * stride_br)
    acc = tl.zeros(cols.shape, dtype=tl.float32)
    for i0 in tl.static_range(0, R, RC):
        ii = i0 + tl.arange(0, RC)
        z = tl.load(z_row + ii, mask=ii < r_live, other=0.0).to(tl.float32)
        b = tl.load(base + ii[:, None] * stride_br + cols[None, :],
                    mask=mask[None, :] & (ii[:, None] < r_live), other=0.0).to(tl.float32)
        acc += tl.sum(z[:, None] * b, axis=0)
    return acc * tl.load(scale_ptr + slot64 * NUM_SLICES + k)
