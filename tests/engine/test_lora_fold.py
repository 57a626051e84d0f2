"""The single-GPU engine's LoRA fold (`EngineConfig.lora_fold`): the fold copies follow
every adapter load and unload, and the fold is refused where it cannot stay in step.
(Token parity with HF + PEFT under the fold: test_engine_parity.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.core import InvalidRequest
from dataplane.engine.engine import Engine

SIZES = dict(dtype="float32", device="cpu", max_num_seqs=4, max_num_batched_tokens=16,
             num_kv_blocks=16, block_size=4, max_slots=2, max_rank=8)


def test_fold_follows_loads_and_unloads(tiny_llama: Path,
                                        tiny_adapters: dict[str, Path]) -> None:
    engine = Engine.from_model_dir(tiny_llama, lora_fold=True, **SIZES)  # type: ignore[arg-type]
    runner = engine.runner
    assert engine.model.lora_fold_rows == 4
    stores = {key: linear.fold for key, linear in runner.linears.items()}
    assert all(s is not None for s in stores.values())
    handle = engine.register_adapter(tiny_adapters["all_r8"])
    for key, store in stores.items():
        assert store is not None
        table = runner.tables[key]
        # the fold holds exactly what the table holds: a slot's rank r rows are nonzero
        # in both or in neither, slice by slice
        for k in range(len(store.widths)):
            r = int(table.ranks[k, handle.slot])
            tail = store.weight_aug[store.base_rows:].view(2, len(store.widths), store.rank, -1)
            assert bool(tail[handle.slot, k, :r].any()) == (r > 0)
            assert not tail[handle.slot, k, r:].any()
            assert float(store.scale[handle.slot, k]) == float(table.scales[k, handle.slot])
    engine.unregister_adapter(handle)
    for store in stores.values():
        assert store is not None
        assert not store.weight_aug[store.base_rows:].any() and not store.scale.any()


def test_fold_is_refused_after_loads_or_without_slots(tiny_llama: Path,
                                                      tiny_adapters: dict[str, Path]) -> None:
    engine = Engine.from_model_dir(tiny_llama, **SIZES)  # type: ignore[arg-type]
    engine.register_adapter(tiny_adapters["attn_r4"])
    with pytest.raises(InvalidRequest, match="before loading adapters"):
        engine.runner.enable_lora_fold(4)
    assert all(linear.fold is None for linear in engine.runner.linears.values())
    no_lora = Engine.from_model_dir(tiny_llama, **{**SIZES, "max_slots": 0})  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="LoRA slots"):
        no_lora.runner.enable_lora_fold(4)
