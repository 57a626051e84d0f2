"""Torch backend: the loop / batched choice, and padded rank rows never leaking.

The batched path reads the active slots' factors into one block matrix and pads
each row's bottleneck to the step's largest rank, so whatever the storage holds
past a slot's rank must not reach ``y``: here those rank rows hold NaN, and the
float64 reference (which only sees the real factors) must still match, with
exact zero deltas where a slot is absent or a slice has rank 0.
"""

from __future__ import annotations

import pytest
import torch

from dataplane.kernels import LoraBatchMeta, LoraMetaBuffers
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.torch_backend import (
    BATCHED_MAX_ROWS_PER_SLOT,
    GROUPED_MAX_ROWS_PER_SLOT,
    TorchLoraBackend,
)
from dataplane.kernels.torch_grouped import group_plans

from .lora_cases import check_case, make_case


def _meta(row_slot: list[int], num_slots: int) -> LoraBatchMeta:
    backend = TorchLoraBackend()
    buffers = LoraMetaBuffers(len(row_slot), num_slots, "cpu")
    return backend.build_meta(torch.tensor(row_slot, dtype=torch.int32), buffers)


def test_auto_rule_batches_decode_slots_and_loops_prefill_slots() -> None:
    auto = TorchLoraBackend()
    n = BATCHED_MAX_ROWS_PER_SLOT
    decode = [0, 1, 2, 3] * n + [-1] * 7  # n rows per active slot; -1 rows not counted
    mixed = [0] * (n + 1) + [1, 2, 3] * n  # slot 0: one row more than the bound
    single = [2] * 3  # one light slot: the loop has a single iteration
    assert auto.batched_slots(_meta(decode, 5)) == [0, 1, 2, 3]
    assert auto.batched_slots(_meta(mixed, 5)) == [1, 2, 3]
    assert auto.batched_slots(_meta(mixed[: n + 1] + [1] * n, 5)) == []
    assert auto.batched_slots(_meta(single, 5)) == []
    assert auto.batched_slots(_meta([-1, -1], 5)) == []
    assert TorchLoraBackend("batched").batched_slots(_meta(single, 5)) == [2]
    assert TorchLoraBackend("loop").batched_slots(_meta(decode, 5)) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_auto_mixed_step_matches_reference(dtype: torch.dtype) -> None:
    """One prefill-sized slot (loop) next to decode-sized ones (batched)."""
    case = make_case(
        dtype=dtype,
        in_features=40,
        out_features=(48, 16, 16),
        ranks=[4, 16, 9],
        num_rows=30,
        dist="skewed",  # slot 0 holds 3/4 of the rows, the others one or two each
        none_share=0.1,
        seed=3,
        absent_every=3,
    )
    auto = TorchLoraBackend()
    light = auto.batched_slots(_meta(case.row_slot, case.table.num_slots))
    assert 0 not in light and len(light) >= 2
    check_case(case, auto)


def test_unknown_path_is_rejected() -> None:
    with pytest.raises(LoraShapeError):
        TorchLoraBackend("fast")


@pytest.mark.parametrize("path", ["loop", "batched", "grouped", "auto"])
@pytest.mark.parametrize("layout", ["stacked", "scattered"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_past_the_rank_never_reaches_y(path: str, layout: str, dtype: torch.dtype) -> None:
    case = make_case(
        dtype=dtype,
        in_features=24,
        out_features=(16, 8, 8),
        ranks=[2, 8, 5],
        num_rows=10,
        dist="uniform",
        none_share=0.2,
        seed=11,
        layout=layout,
        absent_every=2,  # some slots lack a slice: rank 0 next to rank 8
    )
    table = case.table
    for k, width in enumerate(case.out_features):
        for s in range(table.num_slots):
            r = int(table.ranks[k, s])
            pads = ((table.a_rows[k, s, r:], table.in_features), (table.b_rows[k, s, r:], width))
            for homes, w in pads:
                for home in homes.tolist():
                    table.storage[home : home + w] = float("nan")
    check_case(case, TorchLoraBackend(path))


@pytest.mark.parametrize("layout", ["stacked", "scattered"])
def test_grouped_path_serves_a_slot_rewritten_after_its_copy(layout: str) -> None:
    """The grouped path keeps its own copy of each slot's factors: a slot loaded anew
    (another adapter, another rank, a slice dropped) or cleared must be served as it is
    now by the same backend, never from the copy of its old contents."""
    case = make_case(dtype=torch.float32, in_features=24, out_features=(16, 8, 8),
                     ranks=[4, 8], num_rows=12, dist="uniform", none_share=0.1, seed=5,
                     layout=layout)
    grouped = TorchLoraBackend("grouped")
    check_case(case, grouped)
    gen = torch.Generator().manual_seed(6)
    table, slot = case.table, case.row_slot[0] if case.row_slot[0] >= 0 else 1
    new = {k: (torch.randn(2, 24, generator=gen), torch.randn(w, 2, generator=gen), 0.5)
           for k, w in enumerate(case.out_features) if k != 1}
    table.set_slot(slot, new)
    case.factors[slot] = new
    check_case(case, grouped)
    cleared = next(s for s in range(table.num_slots) if s != slot and s in case.row_slot)
    table.clear_slot(cleared)
    case.factors[cleared] = {}
    check_case(case, grouped)


@pytest.mark.parametrize("layout", ["stacked", "scattered"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_path_adds_contiguous_runs_in_place(layout: str, dtype: torch.dtype) -> None:
    """Rows already in slot order with equal counts (one unpadded group), and a prefill
    chunk's contiguous rows beside other slots' rows: those plans read ``x`` and add into
    ``y`` in place, and must match the reference with every other row untouched."""
    case = make_case(dtype=dtype, in_features=24, out_features=(16, 8, 8), ranks=[2, 8, 5],
                     num_rows=24, dist="uniform", none_share=0.0, seed=7, layout=layout,
                     absent_every=2)
    heavy = GROUPED_MAX_ROWS_PER_SLOT + 4
    layouts = {
        "slot order": ([s for s in range(4) for _ in range(6)], [0]),
        "chunk beside decode rows": ([-1, -1] + [3] * heavy + [0, 5], [2]),
    }
    for row_slot, runs in layouts.values():
        case.row_slot = row_slot
        on = [t for t, s in enumerate(row_slot) if s >= 0]
        rows = torch.tensor(sorted(on, key=lambda t: row_slot[t]), dtype=torch.int64)
        counts = [row_slot.count(s) for s in range(case.table.num_slots)]
        plans = group_plans(counts, rows, GROUPED_MAX_ROWS_PER_SLOT)
        assert [p.run for p in plans if p.run is not None] == runs
        check_case(case, TorchLoraBackend("auto"))
