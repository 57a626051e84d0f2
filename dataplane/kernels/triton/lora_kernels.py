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

Shrink splits K into ``eff`` ranges written as separate fp32 partials
``z[split, row, slice, :]``; expand sums them while loading. Deterministic, no
atomics, no zero-fill. ``eff`` is chosen *on the device* from the number of
live row tiles (largest power of two <= ``SPLIT_MAX`` keeping
``tiles * eff <= TARGET`` programs): one adapter gets many splits (enough
programs to stream its factors), 64 adapters few (fewer partials to sum).
Both kernels derive the same ``eff`` from the counts, so nothing is synced.
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
def _total_tiles(counts_ptr, S, BLOCK_M: tl.constexpr, S_PAD: tl.constexpr):
    cols = tl.arange(0, S_PAD)
    counts = tl.load(counts_ptr + cols, mask=cols < S, other=0)
    return tl.sum((counts + BLOCK_M - 1) // BLOCK_M, axis=0)


@triton.jit
def _eff_split(total, SPLIT_MAX: tl.constexpr, TARGET: tl.constexpr):
    """Largest power of two ``<= SPLIT_MAX`` with ``total * eff <= TARGET`` (>= 1)."""
    eff = total * 0 + 1
    for _ in tl.static_range(8):
        grow = (eff * 2 <= SPLIT_MAX) & (total * eff * 2 <= TARGET)
        eff = tl.where(grow, eff * 2, eff)
    return eff


@triton.jit
def _shrink_chunk(
    x_ptr, storage_ptr, rows, mmask, homes, rmask, k_lo, K, K_PER_SPLIT, stride_xm,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``x[rows, k range] @ A[rank chunk, k range]^T`` as fp32 ``[BLOCK_M, BLOCK_R]``."""
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for kk in range(0, K_PER_SPLIT, BLOCK_K):
        k = k_lo + kk + tl.arange(0, BLOCK_K)
        kmask = k < K
        at = tl.load(
            storage_ptr + homes[None, :] + k[:, None],
            mask=rmask[None, :] & kmask[:, None],
            other=0.0,
        )
        xt = tl.load(
            x_ptr + rows[:, None] * stride_xm + k[None, :],
            mask=mmask[:, None] & kmask[None, :],
            other=0.0,
        )
        if UPCAST:
            xt = xt.to(tl.float32)
            at = at.to(tl.float32)
        acc += tl.dot(xt, at, input_precision=PREC)
    return acc


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
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_MAX: tl.constexpr,
    TARGET: tl.constexpr,
    S_PAD: tl.constexpr,
    ALIGN: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    sl = tl.program_id(2)
    slot, tile, total = _slot_tile(pid, counts_ptr, S, BLOCK_M, S_PAD)
    eff = _eff_split(total, SPLIT_MAX, TARGET)
    if (pid >= total) | (pid_k >= eff):
        return
    # Independent loads first (short dependency chain matters at decode sizes).
    table = a_rows_ptr + (sl * S + slot) * R_MAX
    r = tl.arange(0, BLOCK_R)
    homes = tl.load(table + r, mask=r < R_MAX, other=0)
    rank = tl.load(ranks_ptr + sl * S + slot)
    count = tl.load(counts_ptr + slot)
    start = tl.load(starts_ptr + slot)
    if rank == 0:
        return
    if ALIGN > 1:  # lets the compiler vectorise the factor loads
        homes = tl.multiple_of(homes, ALIGN)
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = m < count
    rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
    K_PER_SPLIT = tl.cdiv(tl.cdiv(K, BLOCK_K), eff) * BLOCK_K
    k_lo = pid_k * K_PER_SPLIT
    rmask = r < rank
    acc = _shrink_chunk(
        x_ptr, storage_ptr, rows, mmask, homes, rmask, k_lo, K, K_PER_SPLIT, stride_xm,
        BLOCK_M, BLOCK_R, BLOCK_K, UPCAST, PREC,
    )  # fmt: skip
    zrow = (pid_k * T + rows[:, None]) * NS + sl
    tl.store(z_ptr + zrow * R_MAX + r[None, :], acc, mask=mmask[:, None] & rmask[None, :])
    for r0 in range(BLOCK_R, rank, BLOCK_R):  # ranks beyond one chunk
        rr = r0 + tl.arange(0, BLOCK_R)
        rrmask = rr < rank
        hh = tl.load(table + rr, mask=rrmask, other=0)
        if ALIGN > 1:
            hh = tl.multiple_of(hh, ALIGN)
        acc = _shrink_chunk(
            x_ptr, storage_ptr, rows, mmask, hh, rrmask, k_lo, K, K_PER_SPLIT, stride_xm,
            BLOCK_M, BLOCK_R, BLOCK_K, UPCAST, PREC,
        )  # fmt: skip
        tl.store(z_ptr + zrow * R_MAX + rr[None, :], acc, mask=mmask[:, None] & rrmask[None, :])


@triton.jit
def _pick(sl, v0, v1, v2, v3):
    return tl.where(sl == 0, v0, tl.where(sl == 1, v1, tl.where(sl == 2, v2, v3)))


@triton.jit
def _load_z(z_ptr, rows, mmask, sl, r, rmask, T, NS, R_MAX, eff,
            BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):  # fmt: skip
    """Sum of the shrink's ``eff`` split-K partials for ``rows`` × rank chunk ``r``."""
    zmask = mmask[:, None] & rmask[None, :]
    zt = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for sp in range(eff):
        zoff = ((sp * T + rows[:, None]) * NS + sl) * R_MAX + r[None, :]
        zt += tl.load(z_ptr + zoff, mask=zmask, other=0.0)
    return zt


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
    SPLIT_MAX: tl.constexpr,
    TARGET: tl.constexpr,
    SHRINK_BM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    N_ITERS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    S_PAD: tl.constexpr,
    ALIGN: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):
    """Each program: one (slot, row tile) × ``N_ITERS`` column tiles of one slice."""
    pid = tl.program_id(0)
    pid_n = tl.program_id(1)
    slot, tile, total = _slot_tile(pid, counts_ptr, S, BLOCK_M, S_PAD)
    if pid >= total:
        return
    # Which output slice this column span belongs to (slices of widths W0..W3).
    SPAN: tl.constexpr = BLOCK_N * N_ITERS
    t0: tl.constexpr = (W0 + SPAN - 1) // SPAN
    t1: tl.constexpr = t0 + (W1 + SPAN - 1) // SPAN
    t2: tl.constexpr = t1 + (W2 + SPAN - 1) // SPAN
    sl = (pid_n >= t0).to(tl.int32) + (pid_n >= t1).to(tl.int32) + (pid_n >= t2).to(tl.int32)
    width = _pick(sl, W0, W1, W2, W3)
    col0 = _pick(sl, 0, W0, W0 + W1, W0 + W1 + W2)
    span = pid_n - _pick(sl, 0, t0, t1, t2)
    if ALIGN > 1:  # slice widths are multiples of ALIGN too
        col0 = tl.multiple_of(col0, ALIGN)
    # Independent loads first (short dependency chain matters at decode sizes).
    idx = sl * S + slot
    table = b_rows_ptr + idx * R_MAX
    r = tl.arange(0, BLOCK_R)
    homes = tl.load(table + r, mask=r < R_MAX, other=0)
    rank = tl.load(ranks_ptr + idx)
    scale = tl.load(scales_ptr + idx)
    count = tl.load(counts_ptr + slot)
    start = tl.load(starts_ptr + slot)
    if rank == 0:
        return
    if ALIGN > 1:
        homes = tl.multiple_of(homes, ALIGN)
    rmask = r < rank
    # First factor tile before the row-dependent loads (they wait on `rows`).
    n0 = span * N_ITERS * BLOCK_N + tl.arange(0, BLOCK_N)
    bt_next = tl.load(
        storage_ptr + homes[:, None] + n0[None, :],
        mask=rmask[:, None] & (n0 < width)[None, :],
        other=0.0,
    )
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = m < count
    rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
    eff = _eff_split(_total_tiles(counts_ptr, S, SHRINK_BM, S_PAD), SPLIT_MAX, TARGET)
    z0 = _load_z(z_ptr, rows, mmask, sl, r, rmask, T, NS, R_MAX, eff, BLOCK_M, BLOCK_R)
    if not UPCAST:
        z0 = z0.to(storage_ptr.dtype.element_ty)
    for ni in range(N_ITERS):
        n = n0 + ni * BLOCK_N
        nmask = n < width
        ymask = mmask[:, None] & nmask[None, :]
        yptr = y_ptr + rows[:, None] * stride_ym + (col0 + n)[None, :]
        yv = tl.load(yptr, mask=ymask, other=0.0)
        bt = bt_next
        nn = n + BLOCK_N  # prefetch the next column tile's factor rows
        bt_next = tl.load(
            storage_ptr + homes[:, None] + nn[None, :],
            mask=rmask[:, None] & ((nn < width) & (ni + 1 < N_ITERS))[None, :],
            other=0.0,
        )
        if UPCAST:
            bt = bt.to(tl.float32)
        acc = tl.dot(z0, bt, input_precision=PREC)
        for r0 in range(BLOCK_R, rank, BLOCK_R):  # ranks beyond one chunk
            rr = r0 + tl.arange(0, BLOCK_R)
            rrmask = rr < rank
            zt = _load_z(z_ptr, rows, mmask, sl, rr, rrmask, T, NS, R_MAX, eff, BLOCK_M, BLOCK_R)
            hh = tl.load(table + rr, mask=rrmask, other=0)
            if ALIGN > 1:
                hh = tl.multiple_of(hh, ALIGN)
            bb = tl.load(
                storage_ptr + hh[:, None] + n[None, :],
                mask=rrmask[:, None] & nmask[None, :],
                other=0.0,
            )
            if UPCAST:
                acc += tl.dot(zt, bb.to(tl.float32), input_precision=PREC)
            else:
                acc += tl.dot(zt.to(bb.dtype), bb, input_precision=PREC)
        tl.store(yptr, (yv.to(tl.float32) + acc * scale).to(yv.dtype), mask=ymask)
