# mypy: disable-error-code="no-untyped-def"
"""Paged decode attention in Triton: one query row per request, K/V read in place.

Grid: (requests D, KV heads Hkv). A program loads the G = Hq / Hkv query heads that share
its KV head (padded to 16 rows for `tl.dot`) and walks the request's context in tiles of
BLOCK_N tokens, translating token positions to cache slots through the block table and
keeping an online softmax in fp32 (q·k and p·v in the K/V dtype with fp32 accumulation,
exact fp32 products for fp32 caches). No K/V gather copy, no GQA repeat: K/V bytes are
read once per step. The loop bound is read from `context_lens` on the device, so one
launch shape serves every context length (CUDA-graph friendly: shapes depend on D only).

Split-KV (flash-decoding): with ``splits`` > 1 the grid is (D, Hkv, splits); each program
walks its run of the context's tiles and stores its unnormalised output with its running
max and sum, and a second launch (grid (D, Hkv)) combines the partials in split order. A
decode step has few (row, KV head) pairs at TP > 1 or small batches, and one program
walking a 512-token context tile by tile is latency-bound.

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
from dataplane.triton_launch import cached_plan, sm_count


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, pos_ptr, out_ptr,
    stride_qd, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
    stride_btd, stride_od, stride_oh,
    scale, window, stride_kb, stride_vb, part_ptr, ml_ptr,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCKED: tl.constexpr, SPLITS: tl.constexpr,
):
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
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
    stop = ctx
    if SPLITS > 1:  # this program's run of whole tiles of [start, ctx)
        per = tl.cdiv(tl.cdiv(ctx - start, BLOCK_N), SPLITS) * BLOCK_N
        start = start + sp * per
        stop = tl.minimum(ctx, start + per)
    for n0 in range(start, stop, BLOCK_N):
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
    if SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(out_ptr + row * stride_od + q_heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    else:  # unnormalised partial + its (max, sum) for `_combine_kernel`
        item = (row * tl.num_programs(1) + kvh) * SPLITS + sp
        tl.store(part_ptr + (item * G_PAD + g[:, None]) * D_PAD + d[None, :], acc)
        tl.store(ml_ptr + (item * 2) * G_PAD + g, m_i)
        tl.store(ml_ptr + (item * 2 + 1) * G_PAD + g, l_i)


@triton.jit
def _combine_kernel(
    part_ptr, ml_ptr, out_ptr, stride_od, stride_oh,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """``out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)``, ``M = max_s m_s``, over
    the SPLITS partials of one (row, KV head), in split order (deterministic). A split
    with no key has ``m = -inf``, ``l = 0`` and weighs 0; split 0 always has a key."""
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    base = (row * tl.num_programs(1) + kvh) * SPLITS
    m_max = tl.full([G_PAD], float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):
        m_max = tl.maximum(m_max, tl.load(ml_ptr + ((base + s) * 2) * G_PAD + g))
    den = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for s in tl.static_range(SPLITS):
        w = tl.exp(tl.load(ml_ptr + ((base + s) * 2) * G_PAD + g) - m_max)
        den += w * tl.load(ml_ptr + ((base + s) * 2 + 1) * G_PAD + g)
        part = tl.load(part_ptr + ((base + s) * G_PAD + g[:, None]) * D_PAD + d[None, :])
        acc += w[:, None] * part
    out = acc / den[:, None]
    q_heads = kvh * GROUP + g
    tl.store(out_ptr + row * stride_od + q_heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty),
             mask=(g < GROUP)[:, None] & (d < HEAD_DIM)[None, :])


def decode_splits(rows: int, kv_heads: int, device: torch.device) -> int:
    """Context splits per (row, KV head): the most (a power of two, at most
    ``MAX_SPLITS``) that keeps ``rows * kv_heads * splits`` within ``SPLIT_TARGET``
    programs per multiprocessor (1 off CUDA)."""
    if device.type != "cuda":
        return 1
    sms = sm_count(device)
    splits = 1
    while splits < MAX_SPLITS and rows * kv_heads * splits * 2 <= SPLIT_TARGET * sms:
        splits *= 2
    return splits


# Key tiles of 64 (BLOCK_N) beat tiles of 32 at every decode shape: fewer iterations over
# the same bytes. Splitting a request's keys over several programs pays only where
# (row, KV head) pairs are too few to fill the device (16 rows x 2,048 keys with 4 KV heads;
# a TP=2 rank's 64 rows with 4 KV heads) and costs where they are many (the partials'
# reduce is extra work): splits double while the grid stays within about 4 programs per
# multiprocessor (SPLIT_TARGET). `bench/decode_attention.py` times these shapes; measured:
# docs/PERFORMANCE.md, "Engine".
MAX_SPLITS = 8
SPLIT_TARGET = 4
BLOCK_N = 64


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           positions: torch.Tensor, block_size: int, scale: float,
                           window: int | None, out: torch.Tensor | None = None,
                           splits: int | None = None, block_n: int = BLOCK_N
                           ) -> torch.Tensor:
    """See the module docstring. Every row must have context_lens >= 1. `out` (optional,
    [D, Hq, Dh] in q's dtype, unit inner stride) receives the result in place. `splits`:
    programs per (row, KV head), each over a run of the context's tiles, their partials
    combined by a second launch (None: `decode_splits`); `block_n`: keys per tile."""
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
    splits = decode_splits(rows, kv_heads, q.device) if splits is None else splits
    if splits < 1 or splits & (splits - 1) or block_n < 16 or block_n & (block_n - 1):
        raise ValueError("paged_decode_attention: splits and block_n must be powers of two")
    g_pad, d_pad = max(16, next_pow2(group)), max(16, next_pow2(head_dim))
    consts = dict(
        GROUP=group, G_PAD=g_pad, HEAD_DIM=head_dim, D_PAD=d_pad, BLOCK_SIZE=block_size,
        BLOCK_N=block_n, USE_WINDOW=window is not None,
        PRECISION="ieee" if q.dtype == torch.float32 or interpreting else "tf32",
        UPCAST=interpreting and q.dtype == torch.bfloat16,
        BLOCKED=is_blocked(k_cache), SPLITS=splits,
    )
    if splits > 1:
        items = rows * kv_heads * splits
        part = torch.empty(items * g_pad * d_pad, dtype=torch.float32, device=q.device)
        ml = torch.empty(items * 2 * g_pad, dtype=torch.float32, device=q.device)
    else:  # never touched (SPLITS == 1 compiles the partial stores out): no allocation
        part = ml = out
    tail = (window or 0, kb, vb)
    plan = cached_plan(_paged_decode_kernel, (*ints, *tail, *consts.values()), consts)
    plan((rows, kv_heads, splits), q, k_cache, v_cache, block_tables, context_lens,
         positions, out, *ints, float(scale), *tail, part, ml)
    if splits > 1:
        cconsts = dict(GROUP=group, G_PAD=g_pad, HEAD_DIM=head_dim, D_PAD=d_pad,
                       SPLITS=splits)
        combine = cached_plan(_combine_kernel, (out.stride(0), out.stride(1),
                                                *cconsts.values()), cconsts)
        combine((rows, kv_heads), part, ml, out, out.stride(0), out.stride(1))
    return out
