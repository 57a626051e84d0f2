# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Fused shrink + expand for decode-sized steps: one launch instead of two.

Why: at decode sizes both kernels are latency-bound; two dependent graph nodes
cost a fixed gap before any work starts, and the expand's first loads
(its factor tile, the ``y`` tile) wait for the shrink to finish. Here every
program issues those loads first, then does its share of the shrink.

Decomposition: work items are ``(row tile, slice, split)`` with the split
fastest, ``p = (tile * NS + slice) * eff + split``. ``eff`` (K splits and column
shares per ``(tile, slice)`` group) is picked on the device from the live
tiles: the largest power of two ``<= SPLIT_MAX`` with ``groups * eff <= TARGET``
(the config's ``per_sm`` x multiprocessors), but at least ``MIN_SPLIT`` (so
q/k/v with many live slots still splits K). The grid is fixed by the host at
``max(TARGET, max_groups * MIN_SPLIT)``, enough for every item of any step —
not ``max_groups * SPLIT_MAX``: most of such a grid's programs would only find
their item dead and exit, and their dispatch is not free (the smaller grid
makes the o/down shapes with 64 live slots 11-16% faster). So every program has at
most one item; the loop over items ``pid, pid + grid, ...`` is a safety net
(a group whose items shared a program would wait for itself).
``WEIGHTED`` (the config's ``weighted``): slice ``s`` of a row tile gets
``e_s = round(eff * (K + W_s) / (K + W_min))`` items instead of ``eff`` (its share
of the factor bytes: q/k/v under GQA gives q more splits than k and v, so no
item streams much more than the others); a tile's items are its slices' runs,
``p = tile * sum(e) + e_0 + ... + e_(s-1) + split``; ``eff`` is then the largest
power of two with ``tiles * sum(e) <= TARGET``.
Each item:

1. loads its slot's factor-row addresses, its first ``Bt`` tile and ``y`` tile;
2. computes the partial ``z`` of its rows over its K range;
3. if ``eff > 1``: publishes the partial to scratch ``ws[p]``, arrives at the
   ``(tile, slice)`` counter, waits until all ``eff`` partials are there and
   sums them in split order (deterministic, same in every program);
4. expands its share of the slice's columns (``1 / eff`` of the column tiles):
   ``y[rows, cols] += scale * z @ Bt[:, cols]``, prefetching the next tile by
   hand (``PIPE = 0``) or through Triton's software pipeline ``PIPE`` stages
   deep.

Counters never need a reset: a group's arrivals add exactly ``EPOCH`` to its int64
counter per launch (``_wait_and_sum``), so every launch finds them at multiples of
``EPOCH`` without a memset or a departure ticket (one workspace per stream: launches
sharing counters must not overlap). Forward progress: the programs one counter
waits on have consecutive ids and the hardware dispatches blocks in id order (the
assumption behind CUTLASS's serial split-K semaphore and CUB's decoupled look-back),
so the waiting group is always completed by programs that are already resident.
Under ``TRITON_INTERPRET`` (programs run one after another) the host passes
``SPLIT_MAX = 1``: no waiting.

``PDL`` (the config's ``pdl``, Hopper and later): the launch is a programmatic
dependent launch, so its programs may start while the previous kernel in the stream (the
base GEMM, in the engine) finishes. Everything before ``gdc_wait`` — the step's row
grouping, the factor tables, the factor tiles and the whole shrink over ``x`` — reads
only what was written at least two launches earlier (true in the engine: ``x`` and the
grouping precede the GEMM); ``y``, the scratch and the counters are touched after it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dataplane.intmath import next_pow2
from dataplane.kernels.triton.lora_kernels import _pick, _shrink_chunk

EPOCH_SIZE = 1 << 20
EPOCH = tl.constexpr(EPOCH_SIZE)  # what one group's arrivals add to its counter in one launch


@triton.jit
def _wait_and_sum(ws_ptr, ctr_ptr, p, q, base, sp, eff, acc,
                  BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):  # fmt: skip
    """Publish ``acc`` as partial ``p`` (split ``sp``); return the sum of the ``eff``
    partials of group ``q`` (partials ``base .. base + eff - 1``).

    Arrival adds this split's share of ``EPOCH`` to the group's int64 counter (the
    shares of the ``eff`` splits sum to exactly ``EPOCH``; split 0 takes the remainder),
    so a counter is a multiple of ``EPOCH`` between launches and, within one, the group
    is complete once its counter reaches the next multiple above what any arrival saw:
    no reset, no departure ticket."""
    loc = tl.arange(0, BLOCK_M)[:, None] * BLOCK_R + tl.arange(0, BLOCK_R)[None, :]
    tl.store(ws_ptr + p * (BLOCK_M * BLOCK_R) + loc, acc)
    tl.debug_barrier()  # every thread's partial is written before the release
    share = (EPOCH // eff).to(tl.int64)
    share = tl.where(sp == 0, EPOCH - (eff - 1).to(tl.int64) * share, share)
    old = tl.atomic_add(ctr_ptr + q, share, sem="acq_rel", scope="gpu")
    done = old - old % EPOCH + EPOCH
    cnt = old + share
    while cnt < done:
        cnt = tl.atomic_add(ctr_ptr + q, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
    z = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    group = ws_ptr + base * (BLOCK_M * BLOCK_R) + loc
    for s0 in range(0, eff, 4):
        for j in tl.static_range(4):
            part = tl.load(
                group + (s0 + j) * (BLOCK_M * BLOCK_R),
                mask=tl.where(s0 + j < eff, loc >= 0, False),
                other=0.0,
                cache_modifier=".cg",  # L2, never a stale L1 line
            )
            z += part
    return z


@triton.jit(do_not_specialize=["TARGET"])
def lora_fused_kernel(
    x_ptr, y_ptr, storage_ptr, a_rows_ptr, b_rows_ptr, ranks_ptr, scales_ptr,
    ws_ptr, ctr_ptr, sorted_ptr, counts_ptr, starts_ptr,
    S, K, NS, R_MAX, stride_xm, stride_ym, TARGET,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT_MAX: tl.constexpr, MIN_SPLIT: tl.constexpr,
    S_PAD: tl.constexpr, ALIGN: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
    PIPE: tl.constexpr, PDL: tl.constexpr, WEIGHTED: tl.constexpr, WMIN: tl.constexpr,
):  # fmt: skip
    """``y[rows, slice] += scale * (x[rows] @ A^T) @ Bt`` for every live item of
    this program (one item when ``eff > 1``; every grid-size-th when 1).

    Needs every slot's rank ``<= BLOCK_R`` (the host checks ``max_rank``).
    """
    cols = tl.arange(0, S_PAD)
    counts = tl.load(counts_ptr + cols, mask=cols < S, other=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    n_tiles = tl.sum(tiles, axis=0)
    eff = n_tiles * 0 + 1  # largest power of two <= SPLIT_MAX with items <= TARGET
    for _ in tl.static_range(8):
        more = n_tiles * _per_tile(eff * 2, K, NS, W0, W1, W2, W3, WEIGHTED, WMIN)
        eff = tl.where((eff * 2 <= SPLIT_MAX) & (more <= TARGET), eff * 2, eff)
    eff = tl.maximum(eff, MIN_SPLIT)
    cum = tl.cumsum(tiles, axis=0)
    e0 = _slice_items(eff, K, W0, WEIGHTED, WMIN)
    e1 = _slice_items(eff, K, W1, WEIGHTED, WMIN)
    e2 = _slice_items(eff, K, W2, WEIGHTED, WMIN)
    e3 = _slice_items(eff, K, W3, WEIGHTED, WMIN)
    per_tile = _per_tile(eff, K, NS, W0, W1, W2, W3, WEIGHTED, WMIN)
    for p in range(tl.program_id(0), n_tiles * per_tile, tl.num_programs(0)):
        if WEIGHTED:  # slice sl has e_sl consecutive items per row tile
            pid = p // per_tile
            rem = p - pid * per_tile
            sl = ((rem >= e0).to(tl.int32) + (rem >= e0 + e1).to(tl.int32)
                  + (rem >= e0 + e1 + e2).to(tl.int32))  # fmt: skip
            sp = rem - _pick(sl, 0, e0, e0 + e1, e0 + e1 + e2)
            e = _pick(sl, e0, e1, e2, e3)
        else:
            q = p // eff
            sp = p - q * eff
            pid = q // NS
            sl = q - pid * NS
            e = eff
        _fused_item(
            p, pid, sl, sp, e, tiles, cum, cols, x_ptr, y_ptr, storage_ptr, a_rows_ptr,
            b_rows_ptr, ranks_ptr, scales_ptr, ws_ptr, ctr_ptr, sorted_ptr, counts_ptr,
            starts_ptr, S, K, NS, R_MAX, stride_xm, stride_ym, W0, W1, W2, W3,
            BLOCK_M, BLOCK_R, BLOCK_K, BLOCK_N, ALIGN, UPCAST, PREC, PIPE, PDL,
        )  # fmt: skip
    if PDL:  # every program, items or not: this launch never ends before the previous one
        tl.extra.cuda.gdc_wait()


@triton.jit
def _slice_items(eff, K, W: tl.constexpr, WEIGHTED: tl.constexpr, WMIN: tl.constexpr):
    """Items (K splits = column shares) of a slice of width ``W`` per row tile: ``eff``,
    or with ``WEIGHTED`` ``eff`` scaled by the slice's factor bytes over the narrowest
    slice's, ``(K + W) / (K + WMIN)``, rounded (0 for an absent slice)."""
    if W == 0:
        return eff * 0
    elif WEIGHTED:
        return tl.maximum(1, (eff * (K + W) * 2 + K + WMIN) // (2 * (K + WMIN)))
    else:
        return eff


@triton.jit
def _per_tile(eff, K, NS, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr,
              W3: tl.constexpr, WEIGHTED: tl.constexpr, WMIN: tl.constexpr):  # fmt: skip
    if WEIGHTED:
        return (_slice_items(eff, K, W0, WEIGHTED, WMIN) + _slice_items(eff, K, W1, WEIGHTED, WMIN)
                + _slice_items(eff, K, W2, WEIGHTED, WMIN)
                + _slice_items(eff, K, W3, WEIGHTED, WMIN))  # fmt: skip
    else:
        return eff * NS


@triton.jit
def _fused_item(
    p, pid, sl, sp, eff, tiles, cum, cols, x_ptr, y_ptr, storage_ptr, a_rows_ptr, b_rows_ptr,
    ranks_ptr, scales_ptr, ws_ptr, ctr_ptr, sorted_ptr, counts_ptr, starts_ptr,
    S, K, NS, R_MAX, stride_xm, stride_ym,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr, ALIGN: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
    PIPE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Item ``p`` = split ``sp`` of ``eff`` of slice ``sl`` of live row tile ``pid``
    (its partials are ``p - sp .. p - sp + eff - 1``)."""
    q = pid * NS + sl
    slot = tl.sum((cum <= pid).to(tl.int32), axis=0)
    tile = pid - tl.sum(tl.where(cols < slot, tiles, 0), axis=0)
    width = _pick(sl, W0, W1, W2, W3)
    col0 = _pick(sl, 0, W0, W0 + W1, W0 + W1 + W2)
    if ALIGN > 1:
        col0 = tl.multiple_of(col0, ALIGN)
    # Independent loads first: addresses, rank/scale, the slot's row run.
    idx = sl * S + slot
    r = tl.arange(0, BLOCK_R)
    a_home = tl.load(a_rows_ptr + idx * R_MAX + r, mask=r < R_MAX, other=0)
    b_home = tl.load(b_rows_ptr + idx * R_MAX + r, mask=r < R_MAX, other=0)
    rank = tl.load(ranks_ptr + idx)
    scale = tl.load(scales_ptr + idx)
    count = tl.load(counts_ptr + slot)
    start = tl.load(starts_ptr + slot)
    if rank > 0:  # else the whole group skips: nobody waits on the counter
        if ALIGN > 1:
            a_home = tl.multiple_of(a_home, ALIGN)
            b_home = tl.multiple_of(b_home, ALIGN)
        rmask = r < rank
        # This item's column tiles [j0, j1) of the slice.
        n_tiles = tl.cdiv(width, BLOCK_N)
        per = tl.cdiv(n_tiles, eff)
        j0 = sp * per
        j1 = tl.minimum(j0 + per, n_tiles)
        n = j0 * BLOCK_N + tl.arange(0, BLOCK_N)
        nok = (n < width) & (n < j1 * BLOCK_N)  # empty share when j0 >= j1
        bt = tl.load(storage_ptr + b_home[:, None] + n[None, :],
                     mask=rmask[:, None] & nok[None, :], other=0.0)  # fmt: skip
        m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < count
        rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
        yrow = y_ptr + rows[:, None] * stride_ym + col0
        if not PDL:  # else the previous kernel may still be writing y: after the wait
            yv = tl.load(yrow + n[None, :], mask=mmask[:, None] & nok[None, :], other=0.0)
        # Shrink over this item's K range.
        k_per = tl.cdiv(tl.cdiv(K, BLOCK_K), eff) * BLOCK_K
        acc = _shrink_chunk(
            x_ptr, storage_ptr, rows, mmask, a_home, rmask, sp * k_per, K, k_per, stride_xm,
            BLOCK_M, BLOCK_R, BLOCK_K, UPCAST, PREC, False,
        )  # fmt: skip
        if PDL:  # y, the scratch and the counters only after the previous kernel is done
            tl.extra.cuda.gdc_wait()
            yv = tl.load(yrow + n[None, :], mask=mmask[:, None] & nok[None, :], other=0.0)
        if eff > 1:
            z = _wait_and_sum(ws_ptr, ctr_ptr, p, q, p - sp, sp, eff, acc, BLOCK_M, BLOCK_R)
        else:
            z = acc
        if not UPCAST:
            z = z.to(storage_ptr.dtype.element_ty)
        if PIPE == 0:  # expand this item's column share, prefetching the next tile by hand
            for _j in range(j0, j1):
                nn = n + BLOCK_N
                nn_ok = (nn < width) & (nn < j1 * BLOCK_N)
                bt_next = tl.load(storage_ptr + b_home[:, None] + nn[None, :],
                                  mask=rmask[:, None] & nn_ok[None, :], other=0.0)  # fmt: skip
                y_next = tl.load(yrow + nn[None, :], mask=mmask[:, None] & nn_ok[None, :],
                                 other=0.0)  # fmt: skip
                _expand_tile(z, bt, yv, yrow, n, mmask, width, scale, UPCAST, PREC)
                n = nn
                bt = bt_next
                yv = y_next
        else:  # Triton's software pipeline, PIPE stages deep
            for j in tl.range(j0, j1, num_stages=PIPE):
                nj = j * BLOCK_N + tl.arange(0, BLOCK_N)
                ok = nj < width
                btj = tl.load(storage_ptr + b_home[:, None] + nj[None, :],
                              mask=rmask[:, None] & ok[None, :], other=0.0)  # fmt: skip
                yj = tl.load(yrow + nj[None, :], mask=mmask[:, None] & ok[None, :], other=0.0)
                _expand_tile(z, btj, yj, yrow, nj, mmask, width, scale, UPCAST, PREC)


@triton.jit
def _expand_tile(z, bt, yv, yrow, n, mmask, width, scale, UPCAST: tl.constexpr,
                 PREC: tl.constexpr):  # fmt: skip
    """``y[rows, n] = yv + scale * z @ bt`` (fp32 sum, one rounding)."""
    if UPCAST:
        d = tl.dot(z, bt.to(tl.float32), input_precision=PREC)
    else:
        d = tl.dot(z, bt, input_precision=PREC)
    ymask = mmask[:, None] & (n < width)[None, :]
    tl.store(yrow + n[None, :], (yv.to(tl.float32) + d * scale).to(yv.dtype), mask=ymask)


FUSED_MAX_BLOCK_N = 1024


FUSED_MIN_TILE_ELEMS = 8192


def fused_block_n(block_r: int, n_elems: int) -> int:
    """Output columns per tile: ``Bt`` tile of about ``n_elems`` elements, but never
    narrower than an 8,192-element tile at 64 rows of rank (128 columns below rank
    128): rank 64 is about 15% faster with 128-column tiles than with 64 (16 slots,
    64 rows), while rank 16 wants 256 columns (n_elems 4,096)."""
    floor = FUSED_MIN_TILE_ELEMS // max(block_r, 64)
    return max(floor, min(FUSED_MAX_BLOCK_N, n_elems // block_r))


def fused_block_r(max_rank: int) -> int:
    return max(16, next_pow2(max_rank))
