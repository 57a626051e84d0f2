"""Shared check of a LoRA fold's contents (dataplane/layers/lora_fold_store.py)."""

from __future__ import annotations

import torch

from dataplane.kernels.base import LoraModuleWeights
from dataplane.kernels.factor_table import LoraFactorTable
from dataplane.layers.lora_fold_store import FoldStore


def _rows(w: LoraModuleWeights, homes: torch.Tensor, width: int) -> torch.Tensor:
    cols = torch.arange(width, dtype=torch.int64, device=homes.device)
    return w.storage[homes.to(torch.int64).unsqueeze(-1) + cols]


def assert_fold_holds(store: FoldStore, table: LoraFactorTable | LoraModuleWeights,
                      fold_slot: int, table_slot: int) -> None:
    """Fold slot `fold_slot` = slot `table_slot` of the factor tables (stacked or the
    pool's address tables), bit for bit, zero past the slot's rank."""
    w = table.weights if isinstance(table, LoraFactorTable) else table
    tail = store.weight_aug[store.base_rows:].view(store.hot_slots, len(store.widths),
                                                   store.rank, -1)
    for k, width in enumerate(w.out_features):
        r = int(w.ranks[k, table_slot])
        a = _rows(w, w.a_rows[k, table_slot, :r], w.in_features)
        b = _rows(w, w.b_rows[k, table_slot, :r], width)
        assert torch.equal(tail[fold_slot, k, :r], a)
        assert not tail[fold_slot, k, r:].any()
        assert torch.equal(store.b[k][fold_slot, :r], b)
        assert not store.b[k][fold_slot, r:].any()
        assert float(store.scale[fold_slot, k]) == float(w.scales[k, table_slot])
