"""Torch backend: the loop / batched choice, and padded rank rows never leaking.

The batched path pads every row to the step's largest rank and gathers through
the address tables, so whatever the storage holds past a slot's rank must not
reach ``y``: here those rows hold NaN, and the float64 reference (which only
sees the real factors) must still match, with exact zero deltas where a slot is
absent or a slice has rank 0.
"""

from __future__ import annotations

import pytest
import torch

from dataplane.kernels import LoraBatchMeta, LoraMetaBuffers
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.torch_backend import BATCHED_MAX_ROWS_PER_SLOT, TorchLoraBackend

from .lora_cases import check_case, make_case


def _meta(row_slot: list[int], num_slots: int) -> LoraBatchMeta:
    backend = TorchLoraBackend()
    buffers = LoraMetaBuffers(len(row_slot), num_slots, "cpu")
    return backend.build_meta(torch.tensor(row_slot, dtype=torch.int32), buffers)


def test_auto_rule_batches_decode_steps_and_loops_prefill_steps() -> None:
    auto = TorchLoraBackend()
    n = BATCHED_MAX_ROWS_PER_SLOT
    decode = [0, 1, 2, 3] * n + [-1] * 7  # n rows per active slot; -1 rows not counted
    prefill = [0] * (4 * n + 1) + [1, 2, 3] * n  # one more row than the bound allows
    single = [2] * 3  # one active slot: the loop has a single iteration
    assert auto.chooses_batched(_meta(decode, 5))
    assert not auto.chooses_batched(_meta(prefill, 5))
    assert not auto.chooses_batched(_meta(single, 5))
    assert not auto.chooses_batched(_meta([-1, -1], 5))
    assert TorchLoraBackend("batched").chooses_batched(_meta(single, 5))
    assert not TorchLoraBackend("loop").chooses_batched(_meta(decode, 5))


def test_unknown_path_is_rejected() -> None:
    with pytest.raises(LoraShapeError):
        TorchLoraBackend("fast")


@pytest.mark.parametrize("path", ["loop", "batched", "auto"])
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
