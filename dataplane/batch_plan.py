"""The per-step BatchPlan: pack scheduled sequences, check its invariants.

Torch-free. One `BatchPlan` is built per engine step and shared by every layer. Rows are packed
phase-major: all prefill rows (request by request, each a contiguous chunk), then one row per
decode request. The row coordinates stay distinct: packed row, owning request
(`row_request`), adapter slot (`row_slot`; the LoRA kernels derive their grouped/segment-local
rows from it) and output (`sample_rows`, an inverse map that restores scheduler request
order). Adapter runs never define attention boundaries: attention uses `prefill_indptr`,
`doff` and the block tables only.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from typing import Any

from dataplane.errors import InvalidBatchPlan
from dataplane.errors import is_int as _is_int
from dataplane.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class BatchPlan:
    """One step's packed rows. T rows, R requests (P prefills then D decodes), N sample rows.

    See docs/ENGINE_CONTRACT.md. All fields are tuples of Python ints/strs (torch-free);
    the model runner turns them into device tensors once per step.
    """

    generation: int
    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    row_request: tuple[int, ...]
    row_slot: tuple[int, ...]
    request_ids: tuple[str, ...]
    prefill_indptr: tuple[int, ...]
    doff: int
    context_lens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    slot_mapping: tuple[int, ...]
    sample_rows: tuple[int, ...]
    sample_request_ids: tuple[str, ...]
    block_size: int
    prompt_logprob_rows: tuple[int, ...] = ()
    """Prefill rows (never sampled) whose logits score the next prompt token, for requests
    that ask for prompt logprobs; their logits follow the sample rows' (`logit_rows`)."""

    @property
    def logit_rows(self) -> tuple[int, ...]:
        """Rows whose logits a step returns: the sample rows, then the prompt-logprob rows."""
        return self.sample_rows + self.prompt_logprob_rows if self.prompt_logprob_rows else (
            self.sample_rows)

    @property
    def num_rows(self) -> int:
        return len(self.input_ids)

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_indptr) - 1

    @property
    def num_decodes(self) -> int:
        return len(self.input_ids) - self.doff

    def adapter_runs(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Contiguous adapter runs over packed rows, base (-1) runs included.

        Returns (segment_slot [K], segment_offsets [K+1]); offsets[-1] == T.
        Runs may cross `doff`; they are for the LoRA kernels, never for attention.
        """
        slots: list[int] = []
        offsets = [0]
        for i, s in enumerate(self.row_slot):
            if slots and slots[-1] == s:
                offsets[-1] = i + 1
            else:
                slots.append(s)
                offsets.append(i + 1)
        return tuple(slots), tuple(offsets)


def adapter_aware_prefill_order(prefill_slots: SequenceOf[int], first_decode_slot: int | None
                                ) -> list[int]:
    """Order prefills so that rows of one adapter are contiguous.

    Groups by slot in first-appearance order, stable inside a group; the group sharing the
    first decode row's adapter goes last so that its run continues across `doff`. Returns a
    permutation of range(P): packed position -> index into the scheduler's prefill list.
    """
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(prefill_slots):
        groups.setdefault(s, []).append(i)
    keys = list(groups)
    if first_decode_slot is not None and first_decode_slot in groups:
        keys.remove(first_decode_slot)
        keys.append(first_decode_slot)
    return [i for k in keys for i in groups[k]]


def build_batch_plan(
    prefills: SequenceOf[tuple[Sequence, int]],
    decodes: SequenceOf[Sequence],
    *,
    block_size: int,
    generation: int,
    adapter_aware: bool = True,
    check: bool = True,
) -> BatchPlan:
    """Pack one step's rows phase-major and derive the sampling inverse map.

    `prefills` are (seq, num_new_tokens) in scheduler order: the chunk covers token positions
    [seq.num_computed_tokens, + num_new_tokens). `decodes` are sequences whose only uncomputed
    token is their last one. Scheduler request order is prefills then decodes; `sample_rows`
    follows it, skipping prefill chunks that stop short of the sequence end. With
    `adapter_aware`, prefills are packed in `adapter_aware_prefill_order`; decodes stay stable.
    Block tables must already cover each request's context after this step. Does not mutate
    the sequences. Raises InvalidBatchPlan on any inconsistency; `check` also re-verifies the
    finished plan with `check_batch_plan` (O(T) Python; benchmarks may turn it off).
    """
    if not _is_int(block_size) or block_size < 1:
        raise InvalidBatchPlan("block_size must be an int >= 1", block_size=block_size)
    if not _is_int(generation) or generation < 0:
        raise InvalidBatchPlan("generation must be an int >= 0", generation=generation)
    if not prefills and not decodes:
        raise InvalidBatchPlan("a batch plan needs at least one prefill or decode request")
    for seq, n in prefills:
        start = seq.num_computed_tokens
        if not _is_int(n) or n < 1 or start + n > seq.num_tokens:
            raise InvalidBatchPlan("prefill chunk out of range", request_id=seq.request_id,
                                   start=start, num_new_tokens=n, num_tokens=seq.num_tokens)
    for seq, _ in prefills:
        if seq.is_finished:
            raise InvalidBatchPlan("finished request in batch", request_id=seq.request_id)

    order = list(range(len(prefills)))
    if adapter_aware:
        first_dec = decodes[0].adapter_slot if decodes else None
        order = adapter_aware_prefill_order([s.adapter_slot for s, _ in prefills], first_dec)

    input_ids: list[int] = []
    positions: list[int] = []
    row_request: list[int] = []
    row_slot: list[int] = []
    request_ids: list[str] = []
    indptr = [0]
    context_lens: list[int] = []
    tables: list[tuple[int, ...]] = []
    slot_mapping: list[int] = []
    packed_index: dict[str, int] = {}

    def add_rows(seq: Sequence, start: int, n: int) -> None:
        r = len(request_ids)
        if seq.request_id in packed_index:
            raise InvalidBatchPlan("request appears twice in one plan", request_id=seq.request_id)
        packed_index[seq.request_id] = r
        end = start + n
        table = tuple(seq.block_table)
        if len(table) * block_size < end:
            raise InvalidBatchPlan("block table does not cover the context",
                                   request_id=seq.request_id, context_len=end,
                                   num_blocks=len(table))
        request_ids.append(seq.request_id)
        context_lens.append(end)
        tables.append(table)
        input_ids.extend(seq.token_ids[start:end])
        positions.extend(range(start, end))
        row_request.extend([r] * n)
        base_rows = min(max(seq.active_from - start, 0), n)  # before the activation offset
        row_slot.extend([-1] * base_rows)
        row_slot.extend([seq.adapter_slot] * (n - base_rows))
        pos = start
        while pos < end:  # one run of cache slots per KV block
            block, offset = divmod(pos, block_size)
            run = min(end - pos, block_size - offset)
            first = table[block] * block_size + offset
            slot_mapping.extend(range(first, first + run))
            pos += run

    for i in order:
        seq, n = prefills[i]
        add_rows(seq, seq.num_computed_tokens, n)
        indptr.append(len(input_ids))
    doff = len(input_ids)
    first_decode = len(request_ids)
    finished = SequenceStatus.FINISHED
    for seq in decodes:  # add_rows for one row, inline: it runs for every decode row
        rid, token_ids = seq.request_id, seq.token_ids
        pos = len(token_ids) - 1
        if seq.num_computed_tokens != pos:
            raise InvalidBatchPlan("decode request must have exactly one uncomputed token",
                                   request_id=rid)
        if seq.status is finished:
            raise InvalidBatchPlan("finished request in batch", request_id=rid)
        if rid in packed_index:
            raise InvalidBatchPlan("request appears twice in one plan", request_id=rid)
        packed_index[rid] = len(request_ids)
        table = tuple(seq.block_table)
        if len(table) * block_size <= pos:
            raise InvalidBatchPlan("block table does not cover the context", request_id=rid,
                                   context_len=pos + 1, num_blocks=len(table))
        request_ids.append(rid)
        context_lens.append(pos + 1)
        tables.append(table)
        input_ids.append(token_ids[pos])
        positions.append(pos)
        row_slot.append(seq.adapter_slot if pos >= seq.active_from else -1)
        slot_mapping.append(table[pos // block_size] * block_size + pos % block_size)
    row_request.extend(range(first_decode, len(request_ids)))

    prompt_rows: list[int] = []
    for k, i in enumerate(order):
        seq, n = prefills[i]
        if seq.sampling.prompt_logprobs is not None:  # positions scoring a later prompt token
            start = seq.num_computed_tokens
            prompt_rows.extend(indptr[k] + p - start
                               for p in range(start, min(start + n, seq.num_prompt_tokens - 1)))
    sample_rows: list[int] = []
    sample_ids: list[str] = []
    for seq, n in prefills:  # scheduler order
        if seq.num_computed_tokens + n == seq.num_tokens:
            u = packed_index[seq.request_id]
            sample_rows.append(indptr[u + 1] - 1)
            sample_ids.append(seq.request_id)
    sample_rows.extend(range(doff, doff + len(decodes)))  # every decode row, in order
    sample_ids.extend(request_ids[first_decode:])

    plan = BatchPlan(
        generation=generation, input_ids=tuple(input_ids), positions=tuple(positions),
        row_request=tuple(row_request), row_slot=tuple(row_slot), request_ids=tuple(request_ids),
        prefill_indptr=tuple(indptr), doff=doff, context_lens=tuple(context_lens),
        block_tables=tuple(tables), slot_mapping=tuple(slot_mapping),
        sample_rows=tuple(sample_rows), sample_request_ids=tuple(sample_ids),
        block_size=block_size, prompt_logprob_rows=tuple(prompt_rows),
    )
    if check:
        check_batch_plan(plan)
    return plan


def check_batch_plan(plan: BatchPlan) -> None:
    """Verify every BatchPlan invariant before launch; raise InvalidBatchPlan on the first.

    Checks the packing conditions (indptr monotone with last == doff, adapter runs
    ending at o_K == T, row ownership contiguous per request, a request's rows base (-1) up
    to its activation offset and one adapter slot after it) and
    that positions, context lengths, slot mapping and sample rows agree with each other.
    """
    t = len(plan.input_ids)
    bs = plan.block_size

    def fail(msg: str, **detail: Any) -> None:
        raise InvalidBatchPlan(msg, generation=plan.generation, **detail)

    for name in ("positions", "row_request", "row_slot", "slot_mapping"):
        if len(getattr(plan, name)) != t:
            fail(f"{name} has {len(getattr(plan, name))} rows, expected T={t}")
    ind = plan.prefill_indptr
    p = len(ind) - 1
    if p < 0 or ind[0] != 0 or ind[-1] != plan.doff:
        fail("prefill_indptr must start at 0 and end at doff", indptr=ind, doff=plan.doff)
    if any(ind[u] >= ind[u + 1] for u in range(p)):
        fail("prefill_indptr must be strictly increasing", indptr=ind)
    r = p + (t - plan.doff)
    if not 0 <= plan.doff <= t or len(plan.request_ids) != r:
        fail("request count != prefills + decodes", requests=len(plan.request_ids), expected=r)
    if len(plan.context_lens) != r or len(plan.block_tables) != r:
        fail("context_lens / block_tables must have one entry per request")
    if len(set(plan.request_ids)) != r:
        fail("duplicate request ids in plan")
    slots, offsets = plan.adapter_runs()
    if offsets[-1] != t or len(offsets) != len(slots) + 1:
        fail("adapter runs must end at o_K == T", o_K=offsets[-1], T=t)
    owner = [u for u in range(p) for _ in range(ind[u], ind[u + 1])] + list(range(p, r))
    if list(plan.row_request) != owner:
        fail("row_request disagrees with prefill_indptr / decode rows")
    first_row = [ind[u] for u in range(p)] + list(range(plan.doff, t))
    last_row = [ind[u + 1] - 1 for u in range(p)] + list(range(plan.doff, t))
    positions, row_slot, mapping = plan.positions, plan.row_slot, plan.slot_mapping
    for q, (ctx, table) in enumerate(zip(plan.context_lens, plan.block_tables, strict=True)):
        lo, hi = first_row[q], last_row[q]
        if len(table) * bs < ctx:
            fail("block table does not cover context", request=plan.request_ids[q])
        if positions[hi] != ctx - 1:
            fail("last row of a request must sit at position context_len - 1",
                 request=plan.request_ids[q])
        pos, slot = positions[lo], row_slot[lo]
        if mapping[lo] != table[pos // bs] * bs + pos % bs:
            fail("slot_mapping disagrees with block table", row=lo)
        for i in range(lo + 1, hi + 1):  # a prefill chunk's later rows
            pos += 1
            if positions[i] != pos:
                fail("prefill positions must be consecutive", row=i)
            if row_slot[i] != slot and slot != -1:
                fail("a request's rows are base rows, then rows of one adapter slot",
                     row=i)
            slot = row_slot[i]
            if mapping[i] != table[pos // bs] * bs + pos % bs:
                fail("slot_mapping disagrees with block table", row=i)
    if len(plan.sample_rows) != len(plan.sample_request_ids):
        fail("sample_rows and sample_request_ids differ in length")
    if len(set(plan.sample_rows)) != len(plan.sample_rows):
        fail("a row is sampled twice")
    ends = set(last_row)
    for k, row in enumerate(plan.sample_rows):
        if row not in ends:
            fail("sample row is not a prefill's last row or a decode row", row=row)
        if plan.request_ids[plan.row_request[row]] != plan.sample_request_ids[k]:
            fail("sample row belongs to another request", row=row)
    sampled = set(plan.sample_rows)
    if any(row not in sampled for row in range(plan.doff, t)):
        fail("every decode row must be sampled")
    scored = plan.prompt_logprob_rows
    if len(set(scored)) != len(scored) or any(
            not 0 <= row < plan.doff or row in sampled for row in scored):
        fail("prompt-logprob rows must be distinct prefill rows that are not sampled")
