# mypy: disable-error-code="no-untyped-def"
"""Varlen prefill attention in Triton: every prefill row of a step in one launch.

Flash-attention style: a program owns BLOCK_M consecutive query rows of one request and one
query head (grid: (Hq, tiles); the G = Hq / Hkv heads sharing a KV head are adjacent
programs, so their K/V tiles are reused from L2). It walks the request's keys — read in place
from the paged KV cache through the request's block table, this chunk's keys included (they
are written by `rope_and_cache` before attention runs) — in tiles of BLOCK_N tokens with an
online softmax in fp32 (exp2, scale folded into log2 e). q·k and p·v run in the K/V dtype
with fp32 accumulation (exact fp32 products for fp32 caches).

Per tile the key range is [lo, hi): hi = position of the tile's last valid row + 1 (causal),
lo = 0 or, with a sliding window, the first key the tile's first row still sees (rounded
down to BLOCK_N). Keys below the tile's first position are visible to every row of the
tile (causal mask not needed; only the window is checked); the diagonal tiles are masked
per (row, key). Rows of a chunk at positions [ctx - len, ctx) therefore see all earlier
context of their request (chunked prefill / prefix-cache hits) and nothing of any other
request. No host sync, no K/V gather copy, no GQA repeat.

Contract (`varlen_prefill_attention`):
    q            [T, Hq, Dh]      packed rows (RoPE applied); prefill rows are [0, indptr[-1])
    k_cache/v_cache [S, Hkv, Dh]  flat KV slots (block_id * block_size + offset), or
                  [B, block_size, Hkv, Dh] blocked with any block stride (page-major pools),
                                  holding every key of every prefill request incl. this step's
    batch        PrefillBatch     (metadata.py): indptr, context lens, block tables, tile map
    window       sliding window (key kept iff q_pos - k_pos < window) or None
    out          [>= indptr[-1], Hq, Dh] in q's dtype; rows [0, indptr[-1]) are written
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dataplane.attention.kv_cache import KVCacheLayoutError, is_blocked, kv_strides
from dataplane.attention.metadata import PrefillBatch
from dataplane.intmath import next_pow2
from dataplane.triton_launch import cached_plan

LOG2E = 1.4426950408889634


@triton.jit
def _attend(acc, m_i, l_i, q, k_ptr, v_ptr, bt_row_ptr, kvh, n0, q_pos, hi,
            stride_ks, stride_kh, stride_vs, stride_vh, qk_scale, window,
            d, d_ok, stride_kb, stride_vb, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
            EVEN_D: tl.constexpr, CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr,
            PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCKED: tl.constexpr):
    """One key tile [n0, n0 + BLOCK_N) of the online softmax; returns (acc, m_i, l_i)."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_ok = n < hi
    if CAUSAL:  # the diagonal tiles may run past the last key
        block = tl.load(bt_row_ptr + n // BLOCK_SIZE, mask=n_ok, other=0)
    else:  # every key of an off-diagonal tile exists
        block = tl.load(bt_row_ptr + n // BLOCK_SIZE)
    if BLOCKED:  # block stride != BLOCK_SIZE * token stride (page-major pool views)
        k_off = block.to(tl.int64) * stride_kb + (n % BLOCK_SIZE) * stride_ks
        v_off = block.to(tl.int64) * stride_vb + (n % BLOCK_SIZE) * stride_vs
    else:
        slot = block.to(tl.int64) * BLOCK_SIZE + (n % BLOCK_SIZE)
        k_off = slot * stride_ks
        v_off = slot * stride_vs
    k_ptrs = k_ptr + k_off[:, None] + kvh * stride_kh + d[None, :]
    v_ptrs = v_ptr + v_off[:, None] + kvh * stride_vh + d[None, :]
    if CAUSAL or not EVEN_D:
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [M, N] fp32, log2 units
    if CAUSAL:
        keep = (n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        if USE_WINDOW:
            keep = keep & (q_pos[:, None] - n[None, :] < window)
        s = tl.where(keep, s, float("-inf"))
    elif USE_WINDOW:
        s = tl.where(q_pos[:, None] - n[None, :] < window, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row that has seen no visible key yet keeps m = -inf: shift by 0 instead (no NaN).
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["stride_bt"])  # the table width varies per step
def _varlen_prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, indptr_ptr, ctx_ptr, bt_ptr, tile_req_ptr, tile_row_ptr,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
    stride_bt, qk_scale, window, stride_kb, stride_vb,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCKED: tl.constexpr,
):
    head = tl.program_id(0)
    tile = tl.program_id(1)
    req = tl.load(tile_req_ptr + tile)
    m0 = tl.load(tile_row_ptr + tile)
    q_start = tl.load(indptr_ptr + req)
    q_len = tl.load(indptr_ptr + req + 1) - q_start
    pos0 = tl.load(ctx_ptr + req) - q_len  # position of the request's first row this step
    kvh = head // GROUP
    m = m0 + tl.arange(0, BLOCK_M)
    row_ok = m < q_len
    q_pos = pos0 + tl.minimum(m, q_len - 1)  # padding rows mirror the last row (no NaN)
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    rows = (q_start + m).to(tl.int64)
    io_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :],
                mask=io_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    bt_row_ptr = bt_ptr + req.to(tl.int64) * stride_bt
    first = pos0 + m0
    hi = pos0 + tl.minimum(m0 + BLOCK_M, q_len)
    lo = first * 0
    if USE_WINDOW:
        lo = (tl.maximum(first - window + 1, 0) // BLOCK_N) * BLOCK_N
    diag = (first // BLOCK_N) * BLOCK_N  # keys below `diag` are causally visible to all rows
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for n0 in range(lo, diag, BLOCK_N):
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_ptr, v_ptr, bt_row_ptr, kvh, n0, q_pos,
                                hi, stride_ks, stride_kh, stride_vs, stride_vh, qk_scale,
                                window, d, d_ok, stride_kb, stride_vb, BLOCK_N, BLOCK_SIZE,
                                EVEN_D, False, USE_WINDOW, PRECISION, UPCAST, BLOCKED)
    for n0 in range(tl.maximum(lo, diag), hi, BLOCK_N):
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_ptr, v_ptr, bt_row_ptr, kvh, n0, q_pos,
                                hi, stride_ks, stride_kh, stride_vs, stride_vh, qk_scale,
                                window, d, d_ok, stride_kb, stride_vb, BLOCK_N, BLOCK_SIZE,
                                EVEN_D, True, USE_WINDOW, PRECISION, UPCAST, BLOCKED)
    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + head * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=io_mask)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def varlen_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             batch: PrefillBatch, block_size: int, scale: float,
                             window: int | None, out: torch.Tensor | None = None,
                             block_n: int | None = None, num_warps: int | None = None,
                             num_stages: int | None = None) -> torch.Tensor:
    """See the module docstring. `block_n` / `num_warps` / `num_stages` override the launch
    configuration (benchmarks); BLOCK_M is `batch.block_m` (the tile map is built for it)."""
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[-2]
    try:
        kb, ks, kh = kv_strides(k_cache, block_size)
        vb, vs, vh = kv_strides(v_cache, block_size)
    except KVCacheLayoutError as exc:
        raise ValueError(f"varlen_prefill_attention: {exc}") from exc
    if heads % kv_heads or k_cache.shape[-1] != head_dim or v_cache.shape != k_cache.shape \
            or q.stride(2) != 1 \
            or batch.block_tables.stride(1) != 1 or q.shape[0] < batch.num_rows:
        raise ValueError("varlen_prefill_attention: inconsistent shapes or strides")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif out.shape[1:] != q.shape[1:] or out.shape[0] < batch.num_rows \
            or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError("varlen_prefill_attention: out must match q's heads and dtype")
    if batch.num_tiles == 0:
        return out
    interpreting = _interpreting()
    d_pad = max(16, next_pow2(head_dim))
    if block_n is None:
        block_n = 32 if d_pad > 128 else 64
    if num_warps is None:
        num_warps = 8 if batch.block_m >= 128 else 4
    if num_stages is None:
        num_stages = 2 if d_pad > 64 else 3
    ints = (q.stride(0), q.stride(1), ks, kh, vs, vh, out.stride(0), out.stride(1),
            batch.block_tables.stride(0))
    consts = dict(
        GROUP=heads // kv_heads, HEAD_DIM=head_dim, D_PAD=d_pad, EVEN_D=d_pad == head_dim,
        BLOCK_M=batch.block_m, BLOCK_N=block_n, BLOCK_SIZE=block_size,
        USE_WINDOW=window is not None,
        PRECISION="ieee" if q.dtype == torch.float32 or interpreting else "tf32",
        # Triton's CPU interpreter computes bf16 dots wrongly: upcast there (tests only).
        UPCAST=interpreting and q.dtype == torch.bfloat16, BLOCKED=is_blocked(k_cache),
        num_warps=num_warps, num_stages=num_stages,
    )
    tail = (window or 0, kb, vb)
    plan = cached_plan(_varlen_prefill_kernel, (*ints, *tail, *consts.values()), consts)
    plan((heads, batch.num_tiles),
         q, k_cache, v_cache, out, batch.indptr, batch.context_lens, batch.block_tables,
         batch.tile_request, batch.tile_row, *ints, float(scale * LOG2E), *tail)
    return out
