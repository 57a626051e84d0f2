"""Copying adapters into a LoRA fold (dataplane/layers/lora_fold_slots.py): the batched
copy (one launch over `FoldStore.copy_ranges`, dataplane/ops/triton/copy_jobs.py) leaves
every fold store bit for bit as the torch copies do and as the tables hold, through
evictions, on the CPU (Triton interpreter) and on CUDA."""

from __future__ import annotations

import pytest
import torch

from dataplane.kernels.factor_table import LoraFactorTable
from dataplane.layers.lora_fold_slots import FoldSlots
from dataplane.layers.lora_fold_store import FoldStore

from .fold_checks import assert_fold_holds

# (d_in, slice widths) of four projections, the fold's R = 16 above the tables' 12
PROJECTIONS = ((64, (64, 16, 16)), (64, (64,)), (64, (96, 96)), (96, (64,)))
STEPS = ([0, 1, -1, 0], [2, 3], [4, 0], [5, 6, 5], [1], [6, 2, 4])


def _model(device: torch.device, dtype: torch.dtype, batched: bool, slots: int = 7,
           fold_slots: int = 3) -> tuple[FoldSlots, list[tuple[LoraFactorTable, FoldStore]]]:
    gen = torch.Generator().manual_seed(5)
    fold = FoldSlots(slots, fold_slots, batched=batched)
    pairs = []
    for d_in, widths in PROJECTIONS:
        table = LoraFactorTable(slots, d_in, widths, 12, dtype, device)
        for slot in range(slots):  # mixed ranks, absent slices, distinct scales
            table.set_slot(slot, {
                k: (torch.randn(r, d_in, generator=gen), torch.randn(w, r, generator=gen),
                    0.25 * (slot + 1) + k)
                for k, w in enumerate(widths)
                for r in [1 + (3 * slot + k) % 12] if (slot + k) % 4})
        weight = torch.randn(sum(widths), d_in, generator=gen).to(device, dtype)
        store = FoldStore(weight, widths, fold_slots, 12)
        fold.attach(table, store)
        pairs.append((table, store))
    assert fold.batched is batched
    return fold, pairs


def _check_steps(device: torch.device, dtype: torch.dtype) -> None:
    batched, slow = _model(device, dtype, True), _model(device, dtype, False)
    for step in STEPS:
        assert batched[0].rows(step) == slow[0].rows(step)
        for (table, store), (_, ref) in zip(batched[1], slow[1], strict=True):
            assert torch.equal(store.weight_aug, ref.weight_aug)
            assert all(torch.equal(b, r) for b, r in zip(store.b, ref.b, strict=True))
            assert torch.equal(store.scale, ref.scale)
            for s in step:
                if s >= 0:
                    assert_fold_holds(store, table, batched[0].holder(s), s)
    assert batched[0].copied == slow[0].copied == 11  # evictions happened


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_copy_equals_torch_copies_on_cpu(dtype: torch.dtype) -> None:
    _check_steps(torch.device("cpu"), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_copy_equals_torch_copies_on_cuda(cuda_device: torch.device,
                                                  dtype: torch.dtype) -> None:
    _check_steps(cuda_device, dtype)


def test_odd_widths_fall_back_to_torch_copies() -> None:
    """A bf16 block of an odd number of elements is not whole 4-byte words."""
    table = LoraFactorTable(2, 5, (3,), 4, torch.bfloat16, "cpu")
    fold = FoldSlots(2, 1, batched=True)
    fold.attach(table, FoldStore(torch.zeros(3, 5, dtype=torch.bfloat16), (3,), 1, 4))
    assert fold.batched is False
