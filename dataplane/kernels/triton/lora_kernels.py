# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Segmented shrink Triton kernel over rows grouped by slot, and the helpers
it shares with the expand (``expand_kernel.py``) and the fused launch.

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
``z[split, row, slice, :]``; expand sums them (in split order) while loading.
Deterministic, no atomics, no zero-fill: repeats are bit-identical for any
split count, in decode and prefill alike. ``eff`` is chosen *on the device*
from the number of live row tiles (largest power of two <= ``SPLIT_MAX``
keeping ``tiles * eff <= TARGET`` programs; ``TARGET`` = the config's
``per_sm`` × multiprocessors): one adapter gets many splits (enough programs
to stream its factors), 64 adapters few (fewer partials to sum). In prefill
the same split-K gives a slot's long run of row tiles more programs than
``cdiv(T, BLOCK_M)`` (e.g. T = 4096, ``BLOCK_M`` 64: 64 tiles × 4-8 splits
instead of one program per SM streaming all of K). Both kernels derive the
same ``eff`` from the counts and the same constexprs, so nothing is synced.

``PACK`` (the config's ``pack``, multi-slice modules whose ranks fit one chunk): one
program computes every slice's bottleneck, its ``BLOCK_R`` columns being ``PACK`` runs
of ``BLOCK_R // PACK`` rank rows (slice ``j // RB``, rank row ``j % RB``), so each ``x``
tile is read once for q/k/v (three times when each slice has its own programs).
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
def _slot_split(eff, count, SPLIT_MAX: tl.constexpr, BLOCK_M: tl.constexpr,
                ROW_SPLIT: tl.constexpr):  # fmt: skip
    """K splits of a slot with ``count`` rows: ``eff``, or with ``ROW_SPLIT`` (the
    config's ``row_split``) ``eff`` times the next power of two of its tiles' rows over
    ``ROW_SPLIT``, at most ``SPLIT_MAX`` (shrink and expand derive the same number)."""
    if ROW_SPLIT == 0:
        return eff
    else:
        units = (tl.minimum(count, BLOCK_M) + ROW_SPLIT - 1) // ROW_SPLIT
        w = units * 0 + 1
        for _ in tl.static_range(8):
            w = tl.where(w < units, w * 2, w)
        return tl.minimum(eff * w, SPLIT_MAX)


@triton.jit
def _shrink_chunk(
    x_ptr, storage_ptr, rows, mmask, homes, rmask, k_lo, K, K_PER_SPLIT, stride_xm,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT_X: tl.constexpr,
):  # fmt: skip
    """``x[rows, k range] @ A[rank chunk, k range]^T`` as fp32 ``[BLOCK_M, BLOCK_R]``.

    ``EVICT_X``: load ``x`` with an evict-first hint (prefill: ``x`` is read
    once, while ``A`` is re-read from L2 by every row tile of its slot).
    """
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for kk in range(0, K_PER_SPLIT, BLOCK_K):
        k = k_lo + kk + tl.arange(0, BLOCK_K)
        kmask = k < K
        at = tl.load(
            storage_ptr + homes[None, :] + k[:, None],
            mask=rmask[None, :] & kmask[:, None],
            other=0.0,
        )
        if EVICT_X:
            xt = tl.load(
                x_ptr + rows[:, None] * stride_xm + k[None, :],
                mask=mmask[:, None] & kmask[None, :],
                other=0.0,
                eviction_policy="evict_first",
            )
        else:
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


@triton.jit(do_not_specialize=["T"])  # T varies per step: one compile
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
    EVICT_X: tl.constexpr,
    ROW_SPLIT: tl.constexpr,
    PDL: tl.constexpr,
    PACK: tl.constexpr,
):
    if PDL:  # launched early: everything it reads may still be in flight before this
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    sl = tl.program_id(2)
    slot, tile, total = _slot_tile(pid, counts_ptr, S, BLOCK_M, S_PAD)
    eff = _eff_split(total, SPLIT_MAX, TARGET)
    if pid >= total:
        return
    # (two ifs: a constexpr test, then a tensor one; `and` would mix the two)
    if ROW_SPLIT == 0:  # noqa: SIM102 - else the slot's split count needs its count first
        if pid_k >= eff:
            return
    # Independent loads first (short dependency chain matters at decode sizes).
    if PACK > 0:  # column j = rank row j % RB of slice j // RB: one x stream, all slices
        r = tl.arange(0, BLOCK_R)
        sl_j = r // (BLOCK_R // PACK)
        i_j = r % (BLOCK_R // PACK)
        live = (sl_j < NS) & (i_j < R_MAX)
        rank_j = tl.load(ranks_ptr + sl_j * S + slot, mask=sl_j < NS, other=0)
        homes = tl.load(a_rows_ptr + (sl_j * S + slot) * R_MAX + i_j, mask=live, other=0)
        rank = tl.max(tl.where(live & (i_j < rank_j), 1, 0), axis=0)
    else:
        table = a_rows_ptr + (sl * S + slot) * R_MAX
        r = tl.arange(0, BLOCK_R)
        homes = tl.load(table + r, mask=r < R_MAX, other=0)
        rank = tl.load(ranks_ptr + sl * S + slot)
    count = tl.load(counts_ptr + slot)
    start = tl.load(starts_ptr + slot)
    eff = _slot_split(eff, count, SPLIT_MAX, BLOCK_M, ROW_SPLIT)
    if (rank == 0) | (pid_k >= eff):
        return
    if ALIGN > 1:  # lets the compiler vectorise the factor loads
        homes = tl.multiple_of(homes, ALIGN)
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = m < count
    rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
    K_PER_SPLIT = tl.cdiv(tl.cdiv(K, BLOCK_K), eff) * BLOCK_K
    k_lo = pid_k * K_PER_SPLIT
    if PACK > 0:  # noqa: SIM108 - a constexpr branch (live, rank_j exist only here)
        rmask = live & (i_j < rank_j)
    else:
        rmask = r < rank
    acc = _shrink_chunk(
        x_ptr, storage_ptr, rows, mmask, homes, rmask, k_lo, K, K_PER_SPLIT, stride_xm,
        BLOCK_M, BLOCK_R, BLOCK_K, UPCAST, PREC, EVICT_X,
    )  # fmt: skip
    if PACK > 0:  # every slice's rank fits its RB columns: no further chunk
        zoff = ((pid_k * T + rows[:, None]) * NS + sl_j[None, :]) * R_MAX + i_j[None, :]
        tl.store(z_ptr + zoff, acc, mask=mmask[:, None] & rmask[None, :])
    else:
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
                BLOCK_M, BLOCK_R, BLOCK_K, UPCAST, PREC, EVICT_X,
            )  # fmt: skip
            tl.store(z_ptr + zrow * R_MAX + rr[None, :], acc,
                     mask=mmask[:, None] & rrmask[None, :])  # fmt: skip


@triton.jit
def _pick(sl, v0, v1, v2, v3):
    return tl.where(sl == 0, v0, tl.where(sl == 1, v1, tl.where(sl == 2, v2, v3)))
