# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Segmented shrink / expand Triton kernels over rows grouped by slot.

Work decomposition (both kernels): the rows of slot ``s`` are
``sorted_rows[starts[s] : starts[s] + counts[s]]``; each slot's run is cut into
``BLOCK_M`` row tiles, and grid axis 0 enumerates those tiles over all slots.
A program finds its (slot, tile) from the counts alone (prefix sum of per-slot
tile counts), so the grid is a static upper bound
``cdiv(T, BLOCK_M) + min(S, T)`` that needs no host sync; surplus programs exit.
Rows are read and written in place through ``sorted_rows`` (no packed copy).

Mixed ranks: each program loops over its slot's rank in ``BLOCK_R`` chunks, so
no arithmetic is spent beyond one partial chunk. Factors are read through the
row-address tables: rank row ``i`` of ``A[k, s]`` starts at
``storage + a_rows[k, s, i]`` (paged or stacked, same code).

Shrink splits K into ``SPLIT_K`` ranges written as separate fp32 partials
``z[split, row, slice, :]``; expand sums them while loading. Deterministic, no
atomics, no zero-fill.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _slot_tile(pid, counts_ptr, S, BLOCK_M: tl.constexpr, S_PAD: tl.constexpr):
    """Map tile id ``pid`` to (slot, tile index within slot, total tiles)."""
    cols = tl.arange(0, S_PAD)
    counts = tl.load(counts_ptr + cols, mask=cols < S, other=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    cum = tl.cumsum(tiles, axis=0)
    total = tl.sum(tiles, axis=0)
    slot = tl.sum((cum <= pid).to(tl.int32), axis=0)
    before = tl.sum(tl.where(cols < slot, tiles, 0), axis=0)
    return slot, pid - before, total


@triton.jit
def lora_shrink_kernel(
    x_ptr,
    storage_ptr,
    a_rows_ptr,
    ranks_ptr,
    z_ptr,
    sorted_ptr,
    counts_ptr,
    starts_ptr,
    S,
    K,
    T,
    NS,
    R_MAX,
    stride_xm,
    K_PER_SPLIT,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    S_PAD: tl.constexpr,
    ALIGN: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    sl = tl.program_id(2)
    slot, tile, total = _slot_tile(pid, counts_ptr, S, BLOCK_M, S_PAD)
    if pid >= total:
        return
    rank = tl.load(ranks_ptr + sl * S + slot)
    if rank == 0:
        return
    count = tl.load(counts_ptr + slot)
    start = tl.load(starts_ptr + slot)
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = m < count
    rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
    k_lo = pid_k * K_PER_SPLIT
    table = a_rows_ptr + (sl * S + slot) * R_MAX
    for r0 in range(0, rank, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        rmask = r < rank
        homes = tl.load(table + r, mask=rmask, other=0)
        if ALIGN > 1:  # lets the compiler vectorise the factor loads
            homes = tl.multiple_of(homes, ALIGN)
        acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            k = k_lo + kk + tl.arange(0, BLOCK_K)
            kmask = k < K
            xt = tl.load(
                x_ptr + rows[:, None] * stride_xm + k[None, :],
                mask=mmask[:, None] & kmask[None, :],
                other=0.0,
            )
            at = tl.load(
                storage_ptr + homes[None, :] + k[:, None],
                mask=rmask[None, :] & kmask[:, None],
                other=0.0,
            )
            if UPCAST:
                xt = xt.to(tl.float32)
                at = at.to(tl.float32)
            acc += tl.dot(xt, at, input_precision=PREC)
        zoff = ((pid_k * T + rows[:, None]) * NS + sl) * R_MAX + r[None, :]
        tl.store(z_ptr + zoff, acc, mask=mmask[:, None] & rmask[None, :])


@triton.jit
def _pick(sl, v0, v1, v2, v3):
    return tl.where(sl == 0, v0, tl.where(sl == 1, v1, tl.where(sl == 2, v2, v3)))


@triton.jit
def lora_expand_kernel(
    y_ptr,
    z_ptr,
    storage_ptr,
    b_rows_ptr,
    ranks_ptr,
    scales_ptr,
    sorted_ptr,
    counts_ptr,
    starts_ptr,
    S,
    T,
    NS,
    R_MAX,
    stride_ym,
    W0: tl.constexpr,
    W1: tl.constexpr,
    W2: tl.constexpr,
    W3: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    S_PAD: tl.constexpr,
    ALIGN: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_n = tl.program_id(1)
    slot, tile, total = _slot_tile(pid, counts_ptr, S, BLOCK_M, S_PAD)
    if pid >= total:
        return
    # Which output slice this column tile belongs to (slices of widths W0..W3).
    t0 = tl.cdiv(W0, BLOCK_N)
    t1 = t0 + tl.cdiv(W1, BLOCK_N)
    t2 = t1 + tl.cdiv(W2, BLOCK_N)
    sl = (pid_n >= t0).to(tl.int32) + (pid_n >= t1).to(tl.int32) + (pid_n >= t2).to(tl.int32)
    width = _pick(sl, W0, W1, W2, W3)
    col0 = _pick(sl, 0, W0, W0 + W1, W0 + W1 + W2)
    if ALIGN > 1:  # slice widths are multiples of ALIGN too
        col0 = tl.multiple_of(col0, ALIGN)
    n_tile = pid_n - _pick(sl, 0, t0, t1, t2)
    rank = tl.load(ranks_ptr + sl * S + slot)
    if rank == 0:
        return
    scale = tl.load(scales_ptr + sl * S + slot)
    count = tl.load(counts_ptr + slot)
    start = tl.load(starts_ptr + slot)
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = m < count
    rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < width
    table = b_rows_ptr + (sl * S + slot) * R_MAX
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        rmask = r < rank
        zmask = mmask[:, None] & rmask[None, :]
        zt = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
        for sp in tl.static_range(SPLIT_K):
            zoff = ((sp * T + rows[:, None]) * NS + sl) * R_MAX + r[None, :]
            zt += tl.load(z_ptr + zoff, mask=zmask, other=0.0)
        homes = tl.load(table + r, mask=rmask, other=0)
        if ALIGN > 1:
            homes = tl.multiple_of(homes, ALIGN)
        bt = tl.load(
            storage_ptr + homes[:, None] + n[None, :],
            mask=rmask[:, None] & nmask[None, :],
            other=0.0,
        )
        if UPCAST:
            acc += tl.dot(zt, bt.to(tl.float32), input_precision=PREC)
        else:
            acc += tl.dot(zt.to(bt.dtype), bt, input_precision=PREC)
    yptr = y_ptr + rows[:, None] * stride_ym + (col0 + n)[None, :]
    ymask = mmask[:, None] & nmask[None, :]
    yv = tl.load(yptr, mask=ymask, other=0.0)
    tl.store(yptr, (yv.to(tl.float32) + acc * scale).to(yv.dtype), mask=ymask)
