# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Per-step metadata for large steps: a multi-program stable grouping of rows.

One program sorting every row (``meta_kernel.py``'s ``tl.sort`` path) is
serial and takes tens of µs at T = 4096; here rows are cut into blocks of ``BLOCK`` rows
and every block is handled by its own program:

1. per-block slot histograms ``hist[b, :]`` (``blocked``: a first launch
   writes them to ``LoraMetaBuffers.scratch``; ``blocked1``: every program
   recomputes the ones it needs, one launch, ``O(T)`` reads per program);
2. from them each program derives the global ``counts``/``starts`` (exclusive
   scan over slots) and, per slot, the rows of that slot in earlier blocks;
3. it sorts its own block's packed keys ``slot * BLOCK + local_row`` with
   ``tl.sort`` (unique keys, so stable) and scatters each row to
   ``starts[slot] + rows of slot in earlier blocks + rank inside the block``.

The per-slot offset of step 3 is gathered per row through a scratch vector of
the program's own (``scratch[NB*S_PAD + b*S_PAD : ...]``) written just before:
no ``[BLOCK, S_PAD]`` one-hot in registers. Rows of slot ``-1`` use bucket
``S`` and land after every active row, exactly as in the one-program paths;
the outputs are identical (same stable order, counts, starts). No allocation,
no host sync: capturable in a CUDA graph.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dataplane.intmath import cdiv, next_pow2


@triton.jit(do_not_specialize=["T"])  # T varies per step: one compile
def _block_hist_kernel(
    row_slot_in_ptr, row_slot_ptr, hist_ptr, T, S,
    BLOCK: tl.constexpr, S_PAD: tl.constexpr,
):  # fmt: skip
    """``hist[b, k]`` = rows of block ``b`` in bucket ``k`` (``S`` for slot -1)."""
    b = tl.program_id(0)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    m = offs < T
    s = tl.load(row_slot_in_ptr + offs, mask=m, other=-1).to(tl.int32)
    tl.store(row_slot_ptr + offs, s, mask=m)
    # Rows past T count in bucket S (no histogram mask: older Triton lacks it);
    # harmless: they only follow every real row of the last block.
    h = tl.histogram(tl.where(s < 0, S, s), S_PAD)
    tl.store(hist_ptr + b * S_PAD + tl.arange(0, S_PAD), h)


@triton.jit
def _scatter_block(
    row_slot_in_ptr, sorted_ptr, counts_ptr, starts_ptr, delta_ptr,
    totals, before, mine, b, T, S,
    BLOCK: tl.constexpr, S_PAD: tl.constexpr,
):  # fmt: skip
    """Steps 2–3 for block ``b`` given the histograms' totals, the sum over
    earlier blocks and the block's own histogram (all ``[S_PAD]``)."""
    cols = tl.arange(0, S_PAD)
    starts = tl.cumsum(totals, axis=0) - totals
    if b == 0:
        tl.store(counts_ptr + cols, totals, mask=cols < S)
        tl.store(starts_ptr + cols, starts, mask=cols < S)
    # Row at sorted position i of this block, bucket k, goes to i + delta[k].
    delta = starts + before - (tl.cumsum(mine, axis=0) - mine)
    tl.store(delta_ptr + b * S_PAD + cols, delta)
    tl.debug_barrier()  # every thread's delta is written before the gather
    local = tl.arange(0, BLOCK)
    offs = b * BLOCK + local
    m = offs < T
    s = tl.load(row_slot_in_ptr + offs, mask=m, other=-1).to(tl.int32)
    key = tl.where(s < 0, S, s)  # rows past T sort last in their bucket: never stored
    packed = tl.sort(key * BLOCK + local)
    row = b * BLOCK + packed % BLOCK
    shift = tl.load(delta_ptr + b * S_PAD + packed // BLOCK, cache_modifier=".cg")
    tl.store(sorted_ptr + local + shift, row, mask=row < T)


@triton.jit(do_not_specialize=["T", "NB"])  # T varies per step: one compile
def _block_scatter_kernel(
    row_slot_in_ptr, sorted_ptr, counts_ptr, starts_ptr, hist_ptr, delta_ptr, T, S, NB,
    BLOCK: tl.constexpr, S_PAD: tl.constexpr, HB: tl.constexpr,
):  # fmt: skip
    """Second launch of ``blocked``: reads every block's histogram."""
    b = tl.program_id(0)
    cols = tl.arange(0, S_PAD)
    totals = tl.zeros([S_PAD], dtype=tl.int32)
    before = tl.zeros([S_PAD], dtype=tl.int32)
    mine = tl.zeros([S_PAD], dtype=tl.int32)
    for j0 in range(0, NB, HB):
        j = j0 + tl.arange(0, HB)
        h = tl.load(hist_ptr + j[:, None] * S_PAD + cols[None, :], mask=(j < NB)[:, None], other=0)
        totals += tl.sum(h, axis=0)
        before += tl.sum(tl.where((j < b)[:, None], h, 0), axis=0)
        mine += tl.sum(tl.where((j == b)[:, None], h, 0), axis=0)
    _scatter_block(
        row_slot_in_ptr, sorted_ptr, counts_ptr, starts_ptr, delta_ptr,
        totals, before, mine, b, T, S, BLOCK, S_PAD,
    )  # fmt: skip


@triton.jit(do_not_specialize=["T"])  # T varies per step: one compile
def _block_onepass_kernel(
    row_slot_in_ptr, row_slot_ptr, sorted_ptr, counts_ptr, starts_ptr, delta_ptr, T, S,
    BLOCK: tl.constexpr, S_PAD: tl.constexpr,
):  # fmt: skip
    """``blocked1``: one launch; each program histograms every block itself."""
    b = tl.program_id(0)
    totals = tl.zeros([S_PAD], dtype=tl.int32)
    before = tl.zeros([S_PAD], dtype=tl.int32)
    mine = tl.zeros([S_PAD], dtype=tl.int32)
    for c0 in range(0, T, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        m = offs < T
        s = tl.load(row_slot_in_ptr + offs, mask=m, other=-1).to(tl.int32)
        h = tl.histogram(tl.where(s < 0, S, s), S_PAD)  # rows past T: bucket S, harmless
        totals += h
        before += tl.where(c0 < b * BLOCK, h, 0)
        mine += tl.where(c0 == b * BLOCK, h, 0)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    m = offs < T
    s = tl.load(row_slot_in_ptr + offs, mask=m, other=-1).to(tl.int32)
    tl.store(row_slot_ptr + offs, s, mask=m)
    _scatter_block(
        row_slot_in_ptr, sorted_ptr, counts_ptr, starts_ptr, delta_ptr,
        totals, before, mine, b, T, S, BLOCK, S_PAD,
    )  # fmt: skip


def launch_blocked(
    row_slot_in: object,
    row_slot: object,
    sorted_rows: object,
    counts: object,
    starts: object,
    scratch: object,
    num_rows: int,
    num_slots: int,
    slot_pad: int,
    block: int,
    one_pass: bool,
) -> None:
    """Launch ``blocked`` (two launches) or ``blocked1`` (one); the caller has
    checked that ``scratch`` holds ``2 * cdiv(num_rows, block) * slot_pad``."""
    nb = cdiv(num_rows, block)
    hist = scratch
    delta = scratch[nb * slot_pad :]  # type: ignore[index]
    warps = 4 if block <= 512 else 8
    if one_pass:
        _block_onepass_kernel[(nb,)](
            row_slot_in, row_slot, sorted_rows, counts, starts, delta, num_rows, num_slots,
            BLOCK=block, S_PAD=slot_pad, num_warps=warps,
        )  # fmt: skip
        return
    _block_hist_kernel[(nb,)](
        row_slot_in, row_slot, hist, num_rows, num_slots,
        BLOCK=block, S_PAD=slot_pad, num_warps=4,
    )  # fmt: skip
    hb = max(1, min(next_pow2(nb), 4096 // slot_pad))
    _block_scatter_kernel[(nb,)](
        row_slot_in, sorted_rows, counts, starts, hist, delta, num_rows, num_slots, nb,
        BLOCK=block, S_PAD=slot_pad, HB=hb, num_warps=warps,
    )  # fmt: skip
