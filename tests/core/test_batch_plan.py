"""BatchPlan: the five-request mixed prefill/decode example as exact vectors; invariants.

Two prefills (p0: 3 rows, adapter a; p1: 2 rows, adapter b) and three decodes (d0 a,
d1 base, d2 c) pack into 8 rows, with the adapter-b prefill first.
"""

from __future__ import annotations

import dataclasses

import pytest

from dataplane.core import (
    BatchPlan,
    InvalidBatchPlan,
    Sequence,
    build_batch_plan,
    check_batch_plan,
)

A, B, C, BASE = 0, 1, 2, -1
BS = 4


def _seq(rid: str, prompt: list[int], slot: int, computed: int, blocks: list[int]) -> Sequence:
    seq = Sequence(rid, tuple(prompt), adapter_slot=slot,
                   adapter_digest=None if slot == BASE else f"digest-{slot}")
    seq.num_computed_tokens = computed
    seq.block_table = blocks
    return seq


def _fixture() -> tuple[list[tuple[Sequence, int]], list[Sequence]]:
    p0 = _seq("p0", [10, 11, 12], A, 0, [7])
    p1 = _seq("p1", [20, 21], B, 0, [3])
    d0 = _seq("d0", [30, 31, 32, 33, 34], A, 4, [1, 9])
    d1 = _seq("d1", [40, 41], BASE, 1, [5])
    d2 = _seq("d2", [50, 51, 52, 53, 54, 55, 56, 57, 58], C, 8, [2, 4, 6])
    return [(p0, 3), (p1, 2)], [d0, d1, d2]


def test_five_request_example_exact() -> None:
    prefills, decodes = _fixture()
    plan = build_batch_plan(prefills, decodes, block_size=BS, generation=7)
    assert plan.request_ids == ("p1", "p0", "d0", "d1", "d2")
    assert plan.prefill_indptr == (0, 2, 5)
    assert plan.doff == 5
    assert plan.row_slot == (B, B, A, A, A, A, BASE, C)
    assert plan.row_request == (0, 0, 1, 1, 1, 2, 3, 4)
    assert plan.sample_rows == (4, 1, 5, 6, 7)
    assert plan.sample_request_ids == ("p0", "p1", "d0", "d1", "d2")
    assert plan.adapter_runs() == ((B, A, BASE, C), (0, 2, 6, 7, 8))
    assert plan.input_ids == (20, 21, 10, 11, 12, 34, 41, 58)
    assert plan.positions == (0, 1, 0, 1, 2, 4, 1, 8)
    assert plan.context_lens == (2, 3, 5, 2, 9)
    # flat slot = block_id * 4 + offset, computed by hand from the block tables above
    assert plan.slot_mapping == (12, 13, 28, 29, 30, 9 * 4 + 0, 5 * 4 + 1, 6 * 4 + 0)
    assert plan.generation == 7 and plan.num_prefills == 2 and plan.num_decodes == 3


def test_scheduler_order_when_not_adapter_aware() -> None:
    prefills, decodes = _fixture()
    plan = build_batch_plan(prefills, decodes, block_size=BS, generation=0, adapter_aware=False)
    assert plan.request_ids == ("p0", "p1", "d0", "d1", "d2")
    assert plan.prefill_indptr == (0, 3, 5)
    assert plan.sample_rows == (2, 4, 5, 6, 7)


def test_adapter_grouping_is_stable_within_group() -> None:
    seqs = [_seq(f"r{i}", [1, 2], s, 0, [i]) for i, s in enumerate([A, B, A, BASE, B])]
    plan = build_batch_plan([(s, 2) for s in seqs], [], block_size=BS, generation=0)
    assert plan.request_ids == ("r0", "r2", "r1", "r4", "r3")
    assert plan.sample_request_ids == ("r0", "r1", "r2", "r3", "r4")
    assert plan.sample_rows == (1, 5, 3, 9, 7)


def test_chunked_prefill_has_no_sample_row_until_its_last_chunk() -> None:
    seq = _seq("long", list(range(10)), A, 0, [0, 1, 2])
    first = build_batch_plan([(seq, 4)], [], block_size=BS, generation=0)
    assert first.sample_rows == () and first.context_lens == (4,)
    seq.num_computed_tokens = 4
    second = build_batch_plan([(seq, 6)], [], block_size=BS, generation=1)
    assert second.positions == tuple(range(4, 10))
    assert second.sample_rows == (5,) and second.context_lens == (10,)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: dataclasses.replace(p, prefill_indptr=(0, 2, 4)),
        lambda p: dataclasses.replace(p, row_slot=(B, A, A, A, A, A, BASE, C)),
        lambda p: dataclasses.replace(p, sample_rows=(3, 1, 5, 6, 7)),
        lambda p: dataclasses.replace(p, sample_rows=(4, 1, 5, 6)),
        lambda p: dataclasses.replace(p, sample_request_ids=("p1", "p0", "d0", "d1", "d2")),
        lambda p: dataclasses.replace(p, slot_mapping=(*p.slot_mapping[:-1], 0)),
        lambda p: dataclasses.replace(p, row_request=(0, 0, 1, 1, 2, 2, 3, 4)),
        lambda p: dataclasses.replace(p, positions=(0, 1, 0, 2, 2, 4, 1, 8)),
        lambda p: dataclasses.replace(p, context_lens=(2, 3, 5, 2, 13)),
        lambda p: dataclasses.replace(p, row_slot=(B, B, A, A, A, A, BASE)),
    ],
)
def test_check_rejects_corrupted_plans(mutate: object) -> None:
    prefills, decodes = _fixture()
    plan = build_batch_plan(prefills, decodes, block_size=BS, generation=0)
    bad: BatchPlan = mutate(plan)  # type: ignore[operator]
    with pytest.raises(InvalidBatchPlan) as exc:
        check_batch_plan(bad)
    assert exc.value.code == "INVALID_BATCH_PLAN"


def test_builder_rejects_bad_inputs_without_mutating() -> None:
    prefills, decodes = _fixture()
    with pytest.raises(InvalidBatchPlan):
        build_batch_plan([], [], block_size=BS, generation=0)
    with pytest.raises(InvalidBatchPlan):  # chunk past the end of the sequence
        build_batch_plan([(prefills[0][0], 4)], [], block_size=BS, generation=0)
    short = _seq("short", [1, 2, 3, 4, 5], A, 0, [0])
    with pytest.raises(InvalidBatchPlan, match="block table"):
        build_batch_plan([(short, 5)], [], block_size=BS, generation=0)
    with pytest.raises(InvalidBatchPlan, match="twice"):
        build_batch_plan([], [decodes[0], decodes[0]], block_size=BS, generation=0)
    with pytest.raises(InvalidBatchPlan, match="uncomputed"):
        build_batch_plan([], [prefills[0][0]], block_size=BS, generation=0)
    assert short.num_computed_tokens == 0 and short.block_table == [0]
