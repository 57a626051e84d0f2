"""A projection's hot-slot fold store (dataplane/layers/lora_fold_store.py): the base
weight stays on top, each slot's A rows and B sit where the fold kernels read them, and
rewriting or clearing a slot leaves nothing of the previous adapter."""

from __future__ import annotations

import pytest
import torch

from dataplane.kernels.errors import LoraShapeError, LoraSlotError
from dataplane.layers.lora_fold_store import FoldStore

WIDTHS, D_IN = (6, 4), 5


def factors(rank: int, seed: int) -> dict[int, tuple[torch.Tensor, torch.Tensor, float]]:
    gen = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(rank, D_IN, generator=gen), torch.randn(w, rank, generator=gen),
                0.5 + k) for k, w in enumerate(WIDTHS)}


def test_slots_land_under_the_weight_and_in_b() -> None:
    weight = torch.randn(sum(WIDTHS), D_IN)
    store = FoldStore(weight, WIDTHS, hot_slots=3, max_rank=6)  # R = 8
    assert store.rank == 8 and store.cols == 3 * 2 * 8
    assert torch.equal(store.weight_aug[:10], weight)
    f = factors(6, 1)
    store.write(2, f)
    x = torch.randn(3, D_IN)
    z = x @ store.weight_aug.t()
    for k in range(2):
        start = 10 + (2 * 2 + k) * 8
        a, b, scale = f[k]
        torch.testing.assert_close(z[:, start:start + 6], x @ a.t())
        assert not z[:, start + 6:start + 8].any()  # padded rows
        torch.testing.assert_close(store.b[k][2, :6], b.t())
        assert store.scale[2, k] == scale
    assert not store.weight_aug[10:10 + 2 * 2 * 8].any()  # slots 0 and 1 untouched


def test_rewrite_with_a_lower_rank_and_clear_leave_nothing_behind() -> None:
    store = FoldStore(torch.randn(sum(WIDTHS), D_IN), WIDTHS, hot_slots=2, max_rank=8)
    store.write(1, factors(8, 2))
    store.write(1, {0: factors(3, 3)[0]})  # rank 3, slice 1 not targeted any more
    tail = store.weight_aug[10 + 2 * 8:]
    assert tail[:3].any() and not tail[3:].any()
    assert not store.b[0][1, 3:].any() and not store.b[1][1].any()
    assert store.scale[1, 1] == 0
    store.clear(1)
    assert not store.weight_aug[10:].any() and not store.scale.any()
    assert not any(b.any() for b in store.b)


def test_bad_slots_and_shapes_are_refused() -> None:
    store = FoldStore(torch.randn(sum(WIDTHS), D_IN), WIDTHS, hot_slots=2, max_rank=4)
    with pytest.raises(LoraSlotError):
        store.write(2, factors(4, 4))
    with pytest.raises(LoraShapeError):
        store.write(0, factors(8, 5))  # rank 8 > R 4
    with pytest.raises(LoraSlotError):
        store.clear(-1)
    assert not store.weight_aug[10:].any()


def test_fold_slots_take_only_a_matching_table_and_store() -> None:
    """FoldSlots (dataplane/layers/lora_fold_slots.py) refuses pairs it could not keep in
    step: other slot counts, other slices, a table rank above the fold's, more fold slots
    than table slots."""
    from dataplane.kernels.factor_table import LoraFactorTable
    from dataplane.layers.lora_fold_slots import FoldSlots

    weight = torch.randn(sum(WIDTHS), D_IN)
    table = LoraFactorTable(4, D_IN, WIDTHS, 8, torch.float32, "cpu")
    slots = FoldSlots(4, 2)
    for bad_table, bad_store in (
            (table, FoldStore(weight, WIDTHS, hot_slots=3, max_rank=8)),
            (LoraFactorTable(3, D_IN, WIDTHS, 8, torch.float32, "cpu"),
             FoldStore(weight, WIDTHS, hot_slots=2, max_rank=8)),
            (LoraFactorTable(4, D_IN, WIDTHS[::-1], 8, torch.float32, "cpu"),
             FoldStore(weight, WIDTHS, hot_slots=2, max_rank=8)),
            (LoraFactorTable(4, D_IN, WIDTHS, 16, torch.float32, "cpu"),
             FoldStore(weight, WIDTHS, hot_slots=2, max_rank=8))):
        with pytest.raises(LoraShapeError):
            slots.attach(bad_table, bad_store)
        assert bad_table.mirror is None
    with pytest.raises(LoraShapeError):
        FoldSlots(2, 3)
    store = FoldStore(weight, WIDTHS, hot_slots=2, max_rank=8)
    slots.attach(table, store)
    table.set_slot(3, factors(8, 4))
    assert slots.rows([3, -1, 3]) == [0, -1, 0] and slots.copied == 1
    assert torch.equal(store.b[1][0], table.weights.stacked[1][1][3])  # type: ignore[index]
    with pytest.raises(LoraSlotError):
        slots.rows([4])
