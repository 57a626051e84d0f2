"""Per-step attention metadata: the BatchPlan's request boundaries as device tensors.

Built once per step (shared by every layer). Attention boundaries come only from
`prefill_indptr`, `doff`, the positions and the block tables — never from adapter runs
(seed §0x03A). Every row attends to the keys of its own request at positions
`<= its own position` (and, for sliding-window layers, `> position - window`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.core import BatchPlan


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
class DecodeBatch:
    """Decode rows `[doff, doff + D)`.

    Always: block_tables [D, max_blocks] int64, context_lens [D], positions [D] (int64) —
    what the Triton paged kernel reads in place. Torch path only: padded key slots [D, L]
    and masks[w] [D, L] bool for a gather + SDPA (None when the Triton kernel runs).
    """

    block_tables: torch.Tensor
    context_lens: torch.Tensor
    positions: torch.Tensor
    key_slots: torch.Tensor | None
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
    positions [D] int64. With `gather`, also key_slots [D, width] and masks[w] [D, width]
    bool for the torch path; padding entries (beyond a row's context) address some cache
    slot <= `max_slot` (the trash slot) and are masked out.
    """
    if not gather:
        return DecodeBatch(block_tables, context_lens, positions, None, None)
    k_pos = torch.arange(width, dtype=torch.int64, device=block_tables.device)
    blocks = block_tables.index_select(1, k_pos // block_size)
    key_slots = (blocks * block_size + (k_pos % block_size)[None, :]).clamp(max=max_slot)
    valid = k_pos[None, :] < context_lens[:, None]
    q_pos = positions[:, None]
    masks = {w: _window_mask(q_pos, k_pos[None, :], valid, w) for w in windows}
    return DecodeBatch(block_tables, context_lens, positions, key_slots, masks)


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
                             decode_kernel: str = "torch") -> AttentionMetadata:
    """Convert the plan's attention coordinates into tensors on `device` (one H2D per field).

    `max_slot` is the cache's largest valid slot index (its trash slot).
    """
    bs = plan.block_size
    positions_host = torch.tensor(plan.positions, dtype=torch.int64)
    distinct = distinct_windows(windows)
    prefills = []
    for p in range(plan.num_prefills):
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
        masks = {w: _window_mask(q_pos, k_pos, valid, w).to(device) for w in distinct
                 if not (fresh and (w is None or w >= ctx))}
        prefills.append(PrefillSegment(start, end, slots.to(device), fresh, masks))
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
            torch.tensor(padded, dtype=torch.int64).to(device),
            torch.tensor(lens, dtype=torch.int64).to(device),
            positions_host[plan.doff:].to(device), bs, width, distinct, max_slot,
            gather=decode_kernel == "torch")
    return AttentionMetadata(
        positions=positions_host.to(device),
        slot_mapping=torch.tensor(plan.slot_mapping, dtype=torch.int64).to(device),
        prefills=tuple(prefills), doff=plan.doff, decode=decode, decode_kernel=decode_kernel,
    )
