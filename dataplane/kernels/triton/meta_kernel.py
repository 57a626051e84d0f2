# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Per-step metadata on the device: a stable sort of rows by slot, one launch.

Decode-sized steps (up to ``SORT_AUTO_MAX_ROWS`` rows): one program loads all
slots at once, counts them with ``tl.histogram`` and sorts the packed keys
``slot * BLOCK_T + row`` with ``tl.sort`` (unique keys, so the order is
stable). Larger steps use the multi-program blocked grouping of
``meta_blocked.py`` (per-block histograms, scan, stable scatter), which needs
``LoraMetaBuffers.scratch``. ``chunked`` (one program, two counting passes
over ``[CHUNK, S_PAD]`` one-hots) and ``pairwise`` stay available by name.
Rows of slot ``-1`` use bucket ``S`` and land after every active row. No
allocation, no host sync: captured in the step's CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dataplane.intmath import next_pow2
from dataplane.kernels.base import LoraBatchMeta, LoraMetaBuffers
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.triton.meta_blocked import launch_blocked

MAX_SORT_ROWS = 16384
# Auto: one-program `tl.sort` up to this many rows (a few µs at T <= 256), the blocked
# multi-program grouping above it (one program sorting 4,096 rows takes tens of µs).
# `bench/lora_kernels.py` times both at T = 512 .. 16384 to place this edge.
SORT_AUTO_MAX_ROWS = 512
BLOCKED_ROWS = 256  # rows per program of the blocked grouping (auto)
BLOCKED_METHOD = "blocked"  # two launches; "blocked1" = one launch, O(T) reads per program
METHODS = ("pairwise", "sort", "chunked", "blocked", "blocked1")
# Auto never picks pairwise ranking: its work grows with T * T, and inside a CUDA graph it
# is slower than `tl.sort` at every shape (up to 3-4x at T = 256). Kept for
# `method="pairwise"`.


@triton.jit(do_not_specialize=["T"])  # T varies per step: one compile
def _build_meta_pairwise_kernel(
    row_slot_in_ptr,
    row_slot_ptr,
    sorted_ptr,
    counts_ptr,
    starts_ptr,
    T,
    S,
    BLOCK_T: tl.constexpr,
    S_PAD: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_T)
    m = offs < T
    s = tl.load(row_slot_in_ptr + offs, mask=m, other=-1).to(tl.int32)
    tl.store(row_slot_ptr + offs, s, mask=m)
    key = tl.where(s < 0, S, s)
    cols = tl.arange(0, S_PAD)
    counts = tl.histogram(key, S_PAD)
    starts = tl.cumsum(counts, axis=0) - counts
    tl.store(counts_ptr + cols, counts, mask=cols < S)
    tl.store(starts_ptr + cols, starts, mask=cols < S)
    packed = key * BLOCK_T + offs  # unique: position = number of smaller keys
    pos = tl.sum((packed[None, :] < packed[:, None]).to(tl.int32), axis=1)
    tl.store(sorted_ptr + pos, offs, mask=m)


@triton.jit(do_not_specialize=["T"])  # T varies per step: one compile
def _build_meta_sort_kernel(
    row_slot_in_ptr,
    row_slot_ptr,
    sorted_ptr,
    counts_ptr,
    starts_ptr,
    T,
    S,
    BLOCK_T: tl.constexpr,
    S_PAD: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_T)
    m = offs < T
    s = tl.load(row_slot_in_ptr + offs, mask=m, other=-1).to(tl.int32)
    tl.store(row_slot_ptr + offs, s, mask=m)
    key = tl.where(s < 0, S, s)  # padding rows join bucket S after the real ones
    counts = tl.histogram(key, S_PAD)
    starts = tl.cumsum(counts, axis=0) - counts
    cols = tl.arange(0, S_PAD)
    tl.store(counts_ptr + cols, counts, mask=cols < S)
    tl.store(starts_ptr + cols, starts, mask=cols < S)
    packed = tl.sort(key * BLOCK_T + offs)
    tl.store(sorted_ptr + offs, packed % BLOCK_T, mask=m)


@triton.jit(do_not_specialize=["T"])  # T varies per step: one compile
def _build_meta_kernel(
    row_slot_in_ptr,
    row_slot_ptr,
    sorted_ptr,
    counts_ptr,
    starts_ptr,
    T,
    S,
    CHUNK: tl.constexpr,
    S_PAD: tl.constexpr,
):
    cols = tl.arange(0, S_PAD)
    counts = tl.zeros([S_PAD], dtype=tl.int32)
    for c0 in range(0, T, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        m = offs < T
        s = tl.load(row_slot_in_ptr + offs, mask=m, other=-1).to(tl.int32)
        tl.store(row_slot_ptr + offs, s, mask=m)
        key = tl.where(s < 0, S, s)
        key = tl.where(m, key, S_PAD)
        onehot = (key[:, None] == cols[None, :]).to(tl.int32)
        counts += tl.sum(onehot, axis=0)
    starts = tl.cumsum(counts, axis=0) - counts
    tl.store(counts_ptr + cols, counts, mask=cols < S)
    tl.store(starts_ptr + cols, starts, mask=cols < S)
    running = starts
    for c0 in range(0, T, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        m = offs < T
        s = tl.load(row_slot_in_ptr + offs, mask=m, other=-1).to(tl.int32)
        key = tl.where(s < 0, S, s)
        key = tl.where(m, key, S_PAD)
        onehot = (key[:, None] == cols[None, :]).to(tl.int32)
        incl = tl.cumsum(onehot, axis=0)
        pos = tl.sum(onehot * (incl - 1 + running[None, :]), axis=1)
        tl.store(sorted_ptr + pos, offs, mask=m)
        running += tl.sum(onehot, axis=0)


def build_meta_triton(
    row_slot: torch.Tensor,
    buffers: LoraMetaBuffers,
    method: str | None = None,
    block: int | None = None,
) -> LoraBatchMeta:
    """Fill ``buffers`` for ``row_slot`` (int32/int64 ``[T]``).

    ``method`` forces one of :data:`METHODS` (tests and benchmark); by default
    ``sort`` up to ``SORT_AUTO_MAX_ROWS`` rows, else ``BLOCKED_METHOD``.
    ``block``: rows per program of the blocked methods (power of two >=
    ``buffers.min_block``; default ``BLOCKED_ROWS``). Every method writes the
    same outputs.
    """
    if row_slot.dim() != 1 or row_slot.dtype not in (torch.int32, torch.int64):
        raise LoraShapeError("row_slot must be a 1-D int32/int64 tensor")
    if row_slot.device != buffers.device:
        raise LoraShapeError(f"row_slot on {row_slot.device}, buffers on {buffers.device}")
    if method is not None and method not in METHODS:
        raise LoraShapeError(f"unknown metadata method {method!r}; one of {METHODS}")
    meta = buffers.views(row_slot.shape[0])
    s_pad = max(16, next_pow2(buffers.num_slots + 1))
    block_t = max(16, next_pow2(meta.num_rows))
    sortable = meta.num_rows <= MAX_SORT_ROWS and (buffers.num_slots + 1) * MAX_SORT_ROWS < 2**31
    blk = max(BLOCKED_ROWS, buffers.min_block) if block is None else block
    blockable = (
        blk >= buffers.min_block and blk & (blk - 1) == 0 and (buffers.num_slots + 1) * blk < 2**31
    )
    if method is None:
        if meta.num_rows <= SORT_AUTO_MAX_ROWS and sortable:
            method = "sort"
        elif blockable:
            method = BLOCKED_METHOD
        else:
            method = "sort" if sortable else "chunked"
    if method in ("pairwise", "sort") and not sortable:
        raise LoraShapeError(f"{method} needs T <= {MAX_SORT_ROWS} and a packable key")
    if method in ("blocked", "blocked1"):
        if not blockable:
            raise LoraShapeError(
                f"block {blk} must be a power of two >= buffers.min_block {buffers.min_block}"
            )
        launch_blocked(
            row_slot, meta.row_slot, meta.sorted_rows, meta.slot_counts, meta.slot_starts,
            buffers.scratch, meta.num_rows, buffers.num_slots, s_pad, blk,
            one_pass=method == "blocked1",
        )  # fmt: skip
        return meta
    if method == "pairwise":
        _build_meta_pairwise_kernel[(1,)](
            row_slot,
            meta.row_slot,
            meta.sorted_rows,
            meta.slot_counts,
            meta.slot_starts,
            meta.num_rows,
            buffers.num_slots,
            BLOCK_T=block_t,
            S_PAD=s_pad,
            num_warps=4 if block_t <= 128 else 8,
        )
        return meta
    if method == "sort":
        _build_meta_sort_kernel[(1,)](
            row_slot,
            meta.row_slot,
            meta.sorted_rows,
            meta.slot_counts,
            meta.slot_starts,
            meta.num_rows,
            buffers.num_slots,
            BLOCK_T=block_t,
            S_PAD=s_pad,
            num_warps=4 if block_t <= 1024 else 8,
        )
        return meta
    chunk = max(16, min(128, 4096 // s_pad))
    _build_meta_kernel[(1,)](
        row_slot,
        meta.row_slot,
        meta.sorted_rows,
        meta.slot_counts,
        meta.slot_starts,
        meta.num_rows,
        buffers.num_slots,
        CHUNK=chunk,
        S_PAD=s_pad,
        num_warps=4 if s_pad * chunk <= 4096 else 8,
    )
    return meta
