# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Per-step metadata on the device: a stable counting sort of rows by slot.

One program, two passes over the rows in chunks of ``CHUNK``: (1) per-slot
counts, (2) each row's rank among earlier rows of its slot, through a one-hot
``[CHUNK, S_PAD]`` cumulative sum, scattered to ``starts[slot] + rank``. Rows of
slot ``-1`` use bucket ``S`` and land after every active row. One launch, no
allocation, no host sync, so it is captured in the step's CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dataplane.kernels.base import LoraBatchMeta, LoraMetaBuffers
from dataplane.kernels.errors import LoraShapeError


@triton.jit
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


def build_meta_triton(row_slot: torch.Tensor, buffers: LoraMetaBuffers) -> LoraBatchMeta:
    """Fill ``buffers`` for ``row_slot`` (int32/int64 ``[T]``) in one launch."""
    if row_slot.dim() != 1 or row_slot.dtype not in (torch.int32, torch.int64):
        raise LoraShapeError("row_slot must be a 1-D int32/int64 tensor")
    if row_slot.device != buffers.device:
        raise LoraShapeError(f"row_slot on {row_slot.device}, buffers on {buffers.device}")
    meta = buffers.views(row_slot.shape[0])
    s_pad = max(16, triton.next_power_of_2(buffers.num_slots + 1))
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
