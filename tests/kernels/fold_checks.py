"""Shared check of a LoRA fold's contents (dataplane/layers/lora_fold_store.py)."""

from __future__ import annotations

import torch

from dataplane.kernels.factor_table import LoraFactorTable
from dataplane.layers.lora_fold_store import FoldStore


def assert_fold_holds(store: FoldStore, table: LoraFactorTable, fold_slot: int,
                      table_slot: int) -> None:
    """Fold slot `fold_slot` = table slot `table_slot`, bit for bit (zero past the rank)."""
    assert table.weights.stacked is not None
    tail = store.weight_aug[store.base_rows:].view(store.hot_slots, len(store.widths),
                                                   store.rank, -1)
    rt = table.max_rank
    for k, (a, b) in enumerate(table.weights.stacked):
        assert torch.equal(tail[fold_slot, k, :rt], a[table_slot])
        assert not tail[fold_slot, k, rt:].any()
        assert torch.equal(store.b[k][fold_slot, :rt], b[table_slot])
        assert not store.b[k][fold_slot, rt:].any()
        assert float(store.scale[fold_slot, k]) == float(table.scales[k, table_slot])
