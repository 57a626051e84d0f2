# mypy: disable-error-code="no-untyped-def"
"""Triton RoPE on q/k in place + paged KV cache write (contract: dataplane/ops/rotary_kv.py).

The cache is flat ``[S, Hkv, D]`` or blocked ``[B, block_size, Hkv, D]`` with any block
stride (page-major views into the agent's unified pool; ``dataplane.attention.kv_cache``).

One program per (row, head) of q and k: grid (T, Hq + Hkv); fp32 math, one rounding.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dataplane.attention.kv_cache import kv_strides
from dataplane.intmath import next_pow2
from dataplane.ops.errors import OpsError
from dataplane.triton_launch import LaunchPlan


@triton.jit
def _rope_kv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ct, stride_st, stride_kcs, stride_kch, stride_vcs, stride_vch,
                    stride_kcb, stride_vcb,
                    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                    BLOCKED: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, HALF_PAD)
    m = d < HALF
    c = tl.load(cos_ptr + t * stride_ct + d, mask=m, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * stride_st + d, mask=m, other=0.0).to(tl.float32)
    if h < NUM_Q_HEADS:
        base = q_ptr + t * stride_qt + h * stride_qh
        x1 = tl.load(base + d, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + d, mask=m, other=0.0).to(tl.float32)
        tl.store(base + d, (x1 * c - x2 * s).to(q_ptr.dtype.element_ty), mask=m)
        tl.store(base + HALF + d, (x2 * c + x1 * s).to(q_ptr.dtype.element_ty), mask=m)
    else:
        j = h - NUM_Q_HEADS
        base = k_ptr + t * stride_kt + j * stride_kh
        x1 = tl.load(base + d, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + d, mask=m, other=0.0).to(tl.float32)
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
        vb = v_ptr + t * stride_vt + j * stride_vh
        v1 = tl.load(vb + d, mask=m, other=0.0)
        v2 = tl.load(vb + HALF + d, mask=m, other=0.0)
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
                          v_cache: torch.Tensor, slot_mapping: torch.Tensor
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
    ints = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            cos.stride(0), sin.stride(0), ks, kh, vs, vh, kb, vb)
    _plan(heads, half, blocked, bs, ints)(
        (t, heads + k.shape[1]), q, k, v, cos, sin, k_cache, v_cache, slot_mapping, *ints)
    return q, k


@functools.lru_cache(maxsize=256)
def _plan(heads: int, half: int, blocked: bool, block_size: int,
          ints: tuple[int, ...]) -> LaunchPlan:
    """One plan per value of the specialized integer arguments (the strides)."""
    return LaunchPlan(_rope_kv_kernel, dict(
        NUM_Q_HEADS=heads, HALF=half, HALF_PAD=next_pow2(half), BLOCKED=blocked,
        BLOCK_SIZE=block_size, num_warps=1))
