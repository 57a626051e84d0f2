# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Segmented expand kernel: ``y[rows, slice] += scale * z @ Bt`` in place.

Same work decomposition as the shrink (``lora_kernels.py``): grid axis 0
enumerates (slot, row tile) pairs from the counts, axis 1 the column spans of
all slices. The shrink's ``eff`` split-K partials are summed while loading
``z``; ranks beyond one ``BLOCK_R`` chunk loop over further chunks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dataplane.kernels.triton.lora_kernels import (
    _eff_split,
    _pick,
    _slot_split,
    _slot_tile,
    _total_tiles,
)


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
def _expand_acc(z0, bt, z_ptr, storage_ptr, table, rows, mmask, sl, n, nmask, rank, T, NS,
                R_MAX, eff, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
                ALIGN: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """fp32 ``z @ Bt[:, n]`` for one column tile: first rank chunk from the
    operands given, later chunks (rank > ``BLOCK_R``) loaded here."""
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
    return acc


@triton.jit(do_not_specialize=["T"])  # T varies per step: one compile
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
    Y_PREFETCH: tl.constexpr,
    ROW_SPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Each program: one (slot, row tile) × ``N_ITERS`` column tiles of one slice.

    ``Y_PREFETCH`` picks what the column loop loads one tile ahead: ``False``
    the next ``Bt`` tile (factor rows: small at decode, re-read from L2 by
    every row tile of a slot in prefill), ``True`` the next ``y`` tile (the
    prefill stream), with ``Bt`` loaded in the iteration that uses it. Only
    one of the two is double-buffered, so the live registers stay at one
    ``y`` + one ``Bt`` + the accumulator above a single-buffered loop.
    """
    if PDL:  # launched early: the shrink's z and the GEMM's y only after this
        tl.extra.cuda.gdc_wait()
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
    eff = _slot_split(eff, count, SPLIT_MAX, SHRINK_BM, ROW_SPLIT)
    z0 = _load_z(z_ptr, rows, mmask, sl, r, rmask, T, NS, R_MAX, eff, BLOCK_M, BLOCK_R)
    if not UPCAST:
        z0 = z0.to(storage_ptr.dtype.element_ty)
    yrow = y_ptr + rows[:, None] * stride_ym + col0
    if Y_PREFETCH:
        y_next = tl.load(yrow + n0[None, :], mask=mmask[:, None] & (n0 < width)[None, :],
                         other=0.0)  # fmt: skip
        bt = bt_next
        for ni in range(N_ITERS):
            n = n0 + ni * BLOCK_N
            nmask = n < width
            yv = y_next
            nn = n + BLOCK_N
            nn_ok = (nn < width) & (ni + 1 < N_ITERS)
            y_next = tl.load(yrow + nn[None, :], mask=mmask[:, None] & nn_ok[None, :], other=0.0)
            acc = _expand_acc(
                z0, bt, z_ptr, storage_ptr, table, rows, mmask, sl, n, nmask, rank, T, NS,
                R_MAX, eff, BLOCK_M, BLOCK_R, ALIGN, UPCAST, PREC,
            )  # fmt: skip
            tl.store(yrow + n[None, :], (yv.to(tl.float32) + acc * scale).to(yv.dtype),
                     mask=mmask[:, None] & nmask[None, :])  # fmt: skip
            bt = tl.load(storage_ptr + homes[:, None] + nn[None, :],
                         mask=rmask[:, None] & nn_ok[None, :], other=0.0)  # fmt: skip
    else:
        for ni in range(N_ITERS):
            n = n0 + ni * BLOCK_N
            nmask = n < width
            ymask = mmask[:, None] & nmask[None, :]
            yv = tl.load(yrow + n[None, :], mask=ymask, other=0.0)
            bt = bt_next
            nn = n + BLOCK_N  # prefetch the next column tile's factor rows
            bt_next = tl.load(
                storage_ptr + homes[:, None] + nn[None, :],
                mask=rmask[:, None] & ((nn < width) & (ni + 1 < N_ITERS))[None, :],
                other=0.0,
            )
            acc = _expand_acc(
                z0, bt, z_ptr, storage_ptr, table, rows, mmask, sl, n, nmask, rank, T, NS,
                R_MAX, eff, BLOCK_M, BLOCK_R, ALIGN, UPCAST, PREC,
            )  # fmt: skip
            tl.store(yrow + n[None, :], (yv.to(tl.float32) + acc * scale).to(yv.dtype),
                     mask=ymask)  # fmt: skip
