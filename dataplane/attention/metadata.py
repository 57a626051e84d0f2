"""Per-step attention metadata: the BatchPlan's request boundaries as device tensors.

Built once per step (shared by every layer). Attention boundaries come only from
`prefill_indptr`, `doff`, the positions and the block tables — never from adapter runs
(an adapter run may span requests). Every row attends to the keys of its own request at positions
`<= its own position` (and, for sliding-window layers, `> position - window`).

Prefill rows get either one `PrefillBatch` (Triton varlen kernel: indptr, context lengths,
block tables and a query-tile map; masks are computed in the kernel) or, on the torch path,
one `PrefillSegment` per request with explicit masks and gathered key slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.core import BatchPlan
from dataplane.h2d import to_device, upload


@dataclass(frozen=True)
class PrefillSegment:
    """One prefill request's rows `[start, end)` and the KV slots of its whole context.

    `key_slots` [C] int64: flat KV slot of positions 0..C-1 (C = context after this step);
    empty when `fresh`.
    `fresh` is True when the chunk starts at position 0: its keys are exactly this step's
    rows, so the kernel may use them without reading the cache back.
    `masks[w]` [q, C] bool: key visible to query, for window w (None = full causal); absent
    when the chunk is fresh and the window does not bite, i.e. the mask is plain causal.
    """

    start: int
    end: int
    key_slots: torch.Tensor
    fresh: bool
    masks: dict[int | None, torch.Tensor]


@dataclass(frozen=True)
class PrefillBatch:
    """Every prefill request of a step, for the one-launch Triton varlen kernel.

    All int32 views of one device buffer (one H2D copy per step), shared by every layer:
    indptr [P + 1] (the plan's `prefill_indptr`: request p owns rows [indptr[p], indptr[p+1])),
    context_lens [P] (keys after this step; the chunk sits at positions [ctx - len, ctx)),
    block_tables [P, max_blocks] (padded with block 0 beyond each request's table),
    tile_request / tile_row [num_tiles]: query tile i covers rows tile_row[i] ..
    tile_row[i] + block_m - 1 of request tile_request[i] (heaviest tiles first).
    """

    indptr: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    tile_request: torch.Tensor
    tile_row: torch.Tensor
    block_m: int
    num_rows: int
    num_tiles: int


PREFILL_BLOCK_M = 64
"""Query rows per program of the Triton prefill kernel (the tile map is built for it)."""


def prefill_batch(indptr: tuple[int, ...] | list[int], context_lens: tuple[int, ...] | list[int],
                  block_tables: tuple[tuple[int, ...], ...] | list[list[int]], block_size: int,
                  device: torch.device, block_m: int = PREFILL_BLOCK_M) -> PrefillBatch:
    """Host lists -> PrefillBatch on `device` (one int32 copy). P = len(indptr) - 1 >= 0.

    `context_lens[p]` >= the request's rows; `block_tables[p]` covers its context;
    `block_m` is a power of two >= 16 (a `tl.dot` tile).
    """
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"prefill block_m must be a power of two >= 16, got {block_m}")
    p = len(indptr) - 1
    max_blocks = max([(c + block_size - 1) // block_size for c in context_lens] or [1])
    tiles: list[tuple[int, int, int]] = []  # (work, request, first row)
    for r in range(p):
        length = indptr[r + 1] - indptr[r]
        for m0 in range(0, length, block_m):
            last = context_lens[r] - length + min(m0 + block_m, length)
            tiles.append((last, r, m0))
    tiles.sort(key=lambda t: -t[0])  # longest key ranges first: fewer stragglers
    # One int32 buffer, each segment starting on a 16-byte boundary: Triton specialises
    # pointer arguments on 16-byte alignment, so unaligned segments (offsets that vary
    # with the step's request and tile counts) would each compile another kernel variant
    # in the middle of serving, each one a stall of a large fraction of a second.
    segments: list[list[int]] = [list(indptr), list(context_lens)]
    table_rows: list[int] = []
    for r in range(p):
        table = list(block_tables[r][:max_blocks])
        table_rows += table + [0] * (max_blocks - len(table))
    segments += [table_rows, [t[1] for t in tiles], [t[2] for t in tiles]]
    flat: list[int] = []
    starts = []
    for seg in segments:
        starts.append(len(flat))
        flat += seg + [0] * (-len(seg) % 4)
    buf = to_device(flat, torch.int32, device)
    o0, o1, o2, o3, o4 = starts
    n = len(tiles)
    return PrefillBatch(
        indptr=buf[o0:o0 + p + 1], context_lens=buf[o1:o1 + p],
        block_tables=buf[o2:o2 + p * max_blocks].view(p, max_blocks),
        tile_request=buf[o3:o3 + n], tile_row=buf[o4:o4 + n], block_m=block_m,
        num_rows=indptr[-1] if p else 0,
        num_tiles=n)


@dataclass(frozen=True)
class DecodeBatch:
    """Decode rows `[doff, doff + D)`.

    Always: block_tables [D, max_blocks] int64, context_lens [D], positions [D] (int64) —
    what the Triton paged kernel reads in place. Torch path only: masks[w] [D, L] bool over
    the first L key positions of each row's blocks, for a block gather + SDPA (None when
    the Triton kernel runs).
    """

    block_tables: torch.Tensor
    context_lens: torch.Tensor
    positions: torch.Tensor
    masks: dict[int | None, torch.Tensor] | None


@dataclass(frozen=True)
class AttentionMetadata:
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64 KV slot each row's K/V is written to
    prefills: tuple[PrefillSegment, ...]
    doff: int
    decode: DecodeBatch | None
    decode_kernel: str = "torch"
    """"torch" (gather + SDPA, any device) or "triton" (paged kernel, reads K/V in place)."""
    prefill: PrefillBatch | None = None
    """Set when prefill attention runs the Triton varlen kernel (then `prefills` is empty);
    None: the torch path loops over `prefills` (SDPA per request)."""


def _window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, valid: torch.Tensor,
                 window: int | None) -> torch.Tensor:
    mask = valid & (k_pos <= q_pos)
    if window is not None:
        mask = mask & (q_pos - k_pos < window)
    return mask


def decode_batch(block_tables: torch.Tensor, context_lens: torch.Tensor,
                 positions: torch.Tensor, block_size: int, width: int,
                 windows: tuple[int | None, ...], max_slot: int,
                 gather: bool = True) -> DecodeBatch:
    """Decode metadata computed on the device (no host loop; CUDA-graph capturable).

    block_tables [D, >= ceil(width / block_size)] int64, context_lens [D] int64 (>= 1),
    positions [D] int64. With `gather`, also masks[w] [D, width] bool for the torch path
    (it reads the first `width` key positions of each row's blocks); entries beyond a
    row's context (padding blocks, the tail of its last block) are masked out.
    `max_slot` (the trash slot) is the largest slot any row addresses.
    """
    if not gather:
        return DecodeBatch(block_tables, context_lens, positions, None)
    k_pos = torch.arange(width, dtype=torch.int64, device=block_tables.device)
    valid = k_pos[None, :] < context_lens[:, None]
    q_pos = positions[:, None]
    masks = {w: _window_mask(q_pos, k_pos[None, :], valid, w) for w in windows}
    return DecodeBatch(block_tables, context_lens, positions, masks)


def distinct_windows(windows: tuple[int | None, ...]) -> tuple[int | None, ...]:
    return tuple(sorted(set(windows), key=lambda w: -1 if w is None else w))


def context_slots(block_table: tuple[int, ...] | list[int], length: int,
                  block_size: int) -> torch.Tensor:
    """Flat KV slots [length] int64 of positions 0..length-1 through a block table."""
    pos = torch.arange(length, dtype=torch.int64)
    table = torch.tensor(block_table[:(length + block_size - 1) // block_size],
                         dtype=torch.int64)
    return table[pos // block_size] * block_size + pos % block_size


def build_attention_metadata(plan: BatchPlan, windows: tuple[int | None, ...],
                             device: torch.device, max_slot: int,
                             decode_kernel: str = "torch",
                             prefill_kernel: str | None = None) -> AttentionMetadata:
    """Convert the plan's attention coordinates into tensors on `device` (one H2D per field).

    `max_slot` is the cache's largest valid slot index (its trash slot). `prefill_kernel`
    ("torch" | "triton"; None: same as `decode_kernel`) picks the prefill path: "triton"
    builds one PrefillBatch (no per-request masks or key slots).
    """
    bs = plan.block_size
    positions_host = torch.tensor(plan.positions, dtype=torch.int64)
    distinct = distinct_windows(windows)
    prefill = None
    if (prefill_kernel or decode_kernel) == "triton" and plan.num_prefills:
        p = plan.num_prefills
        prefill = prefill_batch(plan.prefill_indptr, plan.context_lens[:p],
                                plan.block_tables[:p], bs, device)
    prefills = []
    for p in range(plan.num_prefills if prefill is None else 0):
        start, end = plan.prefill_indptr[p], plan.prefill_indptr[p + 1]
        ctx = plan.context_lens[p]
        fresh = plan.positions[start] == 0
        # A fresh chunk's keys are its own rows: the cache is not read back.
        slots = (torch.empty(0, dtype=torch.int64) if fresh
                 else context_slots(plan.block_tables[p], ctx, bs))
        q_pos = positions_host[start:end, None]
        k_pos = torch.arange(ctx, dtype=torch.int64)[None, :]
        valid = torch.ones(1, ctx, dtype=torch.bool)
        # A fresh chunk with no effective window is plain causal: no mask (flash kernels).
        masks = {w: upload(_window_mask(q_pos, k_pos, valid, w), device) for w in distinct
                 if not (fresh and (w is None or w >= ctx))}
        prefills.append(PrefillSegment(start, end, upload(slots, device), fresh, masks))
    decode = None
    num_decodes = plan.num_decodes
    if num_decodes:
        first = plan.num_prefills
        lens = plan.context_lens[first:first + num_decodes]
        tables = plan.block_tables[first:first + num_decodes]
        width = max(lens)
        max_blocks = (width + bs - 1) // bs
        padded = [list(t[:max_blocks]) + [0] * (max_blocks - len(t[:max_blocks]))
                  for t in tables]
        decode = decode_batch(
            to_device(padded, torch.int64, device),
            to_device(lens, torch.int64, device),
            upload(positions_host[plan.doff:], device), bs, width, distinct, max_slot,
            gather=decode_kernel == "torch")
    return AttentionMetadata(
        positions=upload(positions_host, device),
        slot_mapping=to_device(plan.slot_mapping, torch.int64, device),
        prefills=tuple(prefills), doff=plan.doff, decode=decode, decode_kernel=decode_kernel,
        prefill=prefill,
    )
