# mypy: disable-error-code="no-untyped-def"
"""Triton RoPE on q/k in place + paged KV cache write (contract: dataplane/ops/rotary_kv.py).

The cache is flat ``[S, Hkv, D]`` or blocked ``[B, block_size, Hkv, D]`` with any block
stride (page-major views into the agent's unified pool; ``dataplane.attention.kv_cache``).

One program per (row, head) of q and k: grid (T, Hq + Hkv); fp32 math, one rounding.
``FOLD``: q, k and v first get their row's folded LoRA expand (dataplane/ops/lora_fold.py,
the q/k/v GEMM's z columns), rounded to the dtype; v is written back too.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dataplane.attention.kv_cache import kv_strides
from dataplane.intmath import next_pow2
from dataplane.ops.errors import OpsError
from dataplane.ops.lora_fold import FoldedExpand
from dataplane.ops.triton.fold_delta import fold_delta
from dataplane.triton_launch import LaunchPlan


@triton.jit
def _rope_kv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr,
                    z_ptr, fslot_ptr, bq_ptr, bk_ptr, bv_ptr, scale_ptr,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ct, stride_st, stride_kcs, stride_kch, stride_vcs, stride_vch,
                    stride_kcb, stride_vcb, stride_zt, width_q, width_kv,
                    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                    BLOCKED: tl.constexpr, BLOCK_SIZE: tl.constexpr, FOLD: tl.constexpr,
                    R: tl.constexpr, RC: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, HALF_PAD)
    m = d < HALF
    c = tl.load(cos_ptr + t * stride_ct + d, mask=m, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * stride_st + d, mask=m, other=0.0).to(tl.float32)
    fslot = tl.load(fslot_ptr + t) if FOLD else -1
    if h < NUM_Q_HEADS:
        base = q_ptr + t * stride_qt + h * stride_qh
        x1 = tl.load(base + d, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + d, mask=m, other=0.0).to(tl.float32)
        if FOLD:
            col = h * (2 * HALF) + d
            x1 = (x1 + fold_delta(z_ptr, bq_ptr, scale_ptr, fslot, 0, col, m, stride_zt, t,
                                  width_q, 3, R, RC)).to(q_ptr.dtype.element_ty).to(tl.float32)
            x2 = (x2 + fold_delta(z_ptr, bq_ptr, scale_ptr, fslot, 0, col + HALF, m,
                                  stride_zt, t, width_q, 3, R, RC)
                  ).to(q_ptr.dtype.element_ty).to(tl.float32)
        tl.store(base + d, (x1 * c - x2 * s).to(q_ptr.dtype.element_ty), mask=m)
        tl.store(base + HALF + d, (x2 * c + x1 * s).to(q_ptr.dtype.element_ty), mask=m)
    else:
        j = h - NUM_Q_HEADS
        base = k_ptr + t * stride_kt + j * stride_kh
        x1 = tl.load(base + d, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + d, mask=m, other=0.0).to(tl.float32)
        vb = v_ptr + t * stride_vt + j * stride_vh
        v1 = tl.load(vb + d, mask=m, other=0.0)
        v2 = tl.load(vb + HALF + d, mask=m, other=0.0)
        if FOLD:
            col = j * (2 * HALF) + d
            dt = k_ptr.dtype.element_ty
            x1 = (x1 + fold_delta(z_ptr, bk_ptr, scale_ptr, fslot, 1, col, m, stride_zt, t,
                                  width_kv, 3, R, RC)).to(dt).to(tl.float32)
            x2 = (x2 + fold_delta(z_ptr, bk_ptr, scale_ptr, fslot, 1, col + HALF, m,
                                  stride_zt, t, width_kv, 3, R, RC)).to(dt).to(tl.float32)
            v1 = (v1.to(tl.float32) + fold_delta(z_ptr, bv_ptr, scale_ptr, fslot, 2, col, m,
                                                 stride_zt, t, width_kv, 3, R, RC)).to(dt)
            v2 = (v2.to(tl.float32) + fold_delta(z_ptr, bv_ptr, scale_ptr, fslot, 2,
                                                 col + HALF, m, stride_zt, t, width_kv, 3, R, RC)
                  ).to(dt)
            tl.store(vb + d, v1, mask=m)
            tl.store(vb + HALF + d, v2, mask=m)
        y1 = (x1 * c - x2 * s).to(k_ptr.dtype.element_ty)
        y2 = (x2 * c + x1 * s).to(k_ptr.dtype.element_ty)
        tl.store(base + d, y1, mask=m)
        tl.store(base + HALF + d, y2, mask=m)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if BLOCKED:  # [B, BLOCK_SIZE, Hkv, D] with any block stride (page-major pools)
            kc = kc_ptr + (slot // BLOCK_SIZE) * stride_kcb + (slot % BLOCK_SIZE) * stride_kcs \
                + j * stride_kch
            vc = vc_ptr + (slot // BLOCK_SIZE) * stride_vcb + (slot % BLOCK_SIZE) * stride_vcs \
                + j * stride_vch
        else:
            kc = kc_ptr + slot * stride_kcs + j * stride_kch
            vc = vc_ptr + slot * stride_vcs + j * stride_vch
        tl.store(kc + d, y1.to(kc_ptr.dtype.element_ty), mask=m)
        tl.store(kc + HALF + d, y2.to(kc_ptr.dtype.element_ty), mask=m)
        tl.store(vc + d, v1.to(vc_ptr.dtype.element_ty), mask=m)
        tl.store(vc + HALF + d, v2.to(vc_ptr.dtype.element_ty), mask=m)


def _check(q, k, v, cos, sin, k_cache, v_cache, slot_mapping) -> None:
    if q.dim() != 3 or k.dim() != 3 or cos.dim() != 2:
        raise OpsError("rope_and_cache: want q/k/v [T, H, D] and cos/sin [T, D/2]")
    t, _, dim = q.shape
    ok = (k.dim() == 3 and v.shape == k.shape and k.shape[0] == t
          and k.shape[2] == dim and dim % 2 == 0
          and q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
          and cos.shape == (t, dim // 2) and sin.shape == cos.shape
          and cos.stride(1) == 1 and sin.stride(1) == 1
          and k_cache.dim() in (3, 4) and k_cache.shape[-2:] == k.shape[1:]
          and v_cache.shape == k_cache.shape and k_cache.stride(-1) == 1
          and v_cache.stride(-1) == 1 and slot_mapping.shape == (t,)
          and slot_mapping.dtype in (torch.int32, torch.int64))
    if not ok:
        raise OpsError("rope_and_cache: inconsistent shapes or strides", q=tuple(q.shape),
                       k=tuple(k.shape), cos=tuple(cos.shape), cache=tuple(k_cache.shape))


def rope_and_cache_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                          fold: FoldedExpand | None = None, tail: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    _check(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    t, heads, dim = q.shape
    if t == 0:
        return q, k
    half = dim // 2
    blocked = k_cache.dim() == 4
    bs = k_cache.shape[1] if blocked else 1
    kb, ks, kh = kv_strides(k_cache, bs)
    vb, vs, vh = kv_strides(v_cache, bs)
    wq, wkv = heads * dim, k.shape[1] * dim
    if fold is None or tail is None:
        z, fslot, bq, bk, bv, scale, rank, sz = q, q, q, q, q, q, 0, 0
    else:
        fold.check(tail, (wq, wkv, wkv))
        z, fslot, (bq, bk, bv), scale = tail, fold.row_slot, fold.b, fold.scale
        rank, sz = fold.rank, tail.stride(0)
    ints = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            cos.stride(0), sin.stride(0), ks, kh, vs, vh, kb, vb, sz, wq, wkv)
    _plan(heads, half, blocked, bs, rank, ints)(
        (t, heads + k.shape[1]), q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
        z, fslot, bq, bk, bv, scale, *ints)
    return q, k


FOLD_NUM_WARPS = 1  # warps per (row, head) program when the LoRA expand is folded in
FOLD_RC = 64  # rank rows of B per load (capped at the rank)


@functools.lru_cache(maxsize=256)
def _plan(heads: int, half: int, blocked: bool, block_size: int, rank: int,
          ints: tuple[int, ...]) -> LaunchPlan:
    """One plan per value of the specialized integer arguments (the strides)."""
    return LaunchPlan(_rope_kv_kernel, dict(
        NUM_Q_HEADS=heads, HALF=half, HALF_PAD=next_pow2(half), BLOCKED=blocked,
        BLOCK_SIZE=block_size, FOLD=rank > 0, R=max(rank, 1),
        RC=min(max(rank, 1), FOLD_RC),
        num_warps=FOLD_NUM_WARPS if rank else 1))
