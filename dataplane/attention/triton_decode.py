# mypy: disable-error-code="no-untyped-def"
"""Paged decode attention in Triton: one query row per request, K/V read in place.

Grid: (requests D, KV heads Hkv). A program loads the G = Hq / Hkv query heads that share
its KV head (padded to 16 rows for `tl.dot`) and walks the request's context in tiles of
BLOCK_N tokens, translating token positions to cache slots through the block table and
keeping an online softmax in fp32 (q·k and p·v in the K/V dtype with fp32 accumulation,
exact fp32 products for fp32 caches). No K/V gather copy, no GQA repeat: K/V bytes are read
once per step. The loop bound is read from `context_lens` on the device, so one launch
shape serves every context length (CUDA-graph friendly: shapes depend on D only).

Contract:
    q            [D, Hq, Dh]        (RoPE applied; fp16/bf16/fp32)
    k_cache/v_cache [S, Hkv, Dh]    flat KV slots (block_id * block_size + offset), or
                    [B, block_size, Hkv, Dh] blocked, any block stride (page-major pools)
    block_tables [D, max_blocks]    int32/int64 block ids
    context_lens [D]                keys visible to each row = positions [0, context_lens)
    positions    [D]                query position (context_lens - 1 for a decode row)
    window       sliding window (key kept iff pos - k_pos < window) or None
    -> out       [D, Hq, Dh] in q's dtype
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dataplane.attention.kv_cache import KVCacheLayoutError, is_blocked, kv_strides
from dataplane.intmath import next_pow2
from dataplane.triton_launch import cached_plan


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, pos_ptr, out_ptr,
    stride_qd, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
    stride_btd, stride_od, stride_oh,
    scale, window, stride_kb, stride_vb,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCKED: tl.constexpr,
):
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    q_heads = kvh * GROUP + g
    q = tl.load(q_ptr + row * stride_qd + q_heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    ctx = tl.load(lens_ptr + row).to(tl.int32)
    pos = tl.load(pos_ptr + row).to(tl.int32)
    start = pos * 0
    if USE_WINDOW:
        start = tl.maximum(pos - window + 1, 0)
        start = (start // BLOCK_N) * BLOCK_N
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    n_base = tl.arange(0, BLOCK_N)
    for n0 in range(start, ctx, BLOCK_N):
        n = n0 + n_base
        valid = (n < ctx) & (n <= pos)
        if USE_WINDOW:
            valid = valid & (pos - n < window)
        block = tl.load(bt_ptr + row * stride_btd + n // BLOCK_SIZE, mask=n < ctx, other=0)
        if BLOCKED:  # block stride != BLOCK_SIZE * token stride (page-major pool views)
            k_off = block.to(tl.int64) * stride_kb + (n % BLOCK_SIZE) * stride_ks
            v_off = block.to(tl.int64) * stride_vb + (n % BLOCK_SIZE) * stride_vs
        else:
            slot = block.to(tl.int64) * BLOCK_SIZE + (n % BLOCK_SIZE)
            k_off = slot * stride_ks
            v_off = slot * stride_vs
        kv_mask = valid[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + k_off[:, None] + kvh * stride_kh + d[None, :],
                    mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [G_PAD, BLOCK_N] fp32
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + v_off[:, None] + kvh * stride_vh + d[None, :],
                    mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + row * stride_od + q_heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           positions: torch.Tensor, block_size: int, scale: float,
                           window: int | None, out: torch.Tensor | None = None
                           ) -> torch.Tensor:
    """See the module docstring. Every row must have context_lens >= 1. `out` (optional,
    [D, Hq, Dh] in q's dtype, unit inner stride) receives the result in place."""
    rows, heads, head_dim = q.shape
    kv_heads, cache_dim = k_cache.shape[-2], k_cache.shape[-1]
    try:
        kb, ks, kh = kv_strides(k_cache, block_size)
        vb, vs, vh = kv_strides(v_cache, block_size)
    except KVCacheLayoutError as exc:
        raise ValueError(f"paged_decode_attention: {exc}") from exc
    if heads % kv_heads or cache_dim != head_dim or q.stride(2) != 1 \
            or v_cache.shape != k_cache.shape or block_tables.dim() != 2 \
            or block_tables.shape[0] != rows or block_tables.stride(1) != 1:
        raise ValueError("paged_decode_attention: inconsistent shapes or strides")
    group = heads // kv_heads
    # Triton's CPU interpreter computes bf16 dots wrongly: upcast there (tests only).
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError("paged_decode_attention: out must match q's shape and dtype")
    if rows == 0:
        return out
    ints = (q.stride(0), q.stride(1), ks, kh, vs, vh, block_tables.stride(0),
            out.stride(0), out.stride(1))
    consts = dict(
        GROUP=group, G_PAD=max(16, next_pow2(group)), HEAD_DIM=head_dim,
        D_PAD=max(16, next_pow2(head_dim)), BLOCK_SIZE=block_size,
        BLOCK_N=32, USE_WINDOW=window is not None,
        PRECISION="ieee" if q.dtype == torch.float32 or interpreting else "tf32",
        UPCAST=interpreting and q.dtype == torch.bfloat16,
        BLOCKED=is_blocked(k_cache),
    )
    tail = (window or 0, kb, vb)
    plan = cached_plan(_paged_decode_kernel, (*ints, *tail, *consts.values()), consts)
    plan((rows, kv_heads), q, k_cache, v_cache, block_tables, context_lens, positions, out,
         *ints, float(scale), *tail)
    return out
