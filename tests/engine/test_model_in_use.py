"""One live engine per model object: a second engine on the same model would re-attach the
projections' LoRA tables and leave the first serving its adapters' requests on the base
weights. It is refused (typed, stable code) and changes nothing; once the first engine is
dropped the model can serve a new one."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from dataplane.artifacts import read_base_abi
from dataplane.core import ModelInUse, SamplingParams
from dataplane.engine.adapters import AdapterHandle
from dataplane.engine.engine import Engine, EngineConfig
from dataplane.models import load_model


def config(slots: int) -> EngineConfig:
    return EngineConfig(max_num_seqs=2, num_kv_blocks=64, block_size=4, max_rank=8,
                        max_slots=slots)


def greedy(engine: Engine, handle: AdapterHandle | None) -> list[int]:
    out = engine.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=6),
                          [handle])
    return list(out[0].token_ids)


def test_second_engine_on_a_live_engines_model_is_refused(
        tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    model = load_model(tiny_llama, torch.float32, torch.device("cpu"))
    abi = read_base_abi(tiny_llama)
    first = Engine(model, config(2), abi.h_base, abi)
    handle = first.register_adapter(tiny_adapters["all_r8"])
    before = greedy(first, handle)
    tables = {key: linear.factors for key, linear in first.runner.linears.items()}
    for slots in (0, 2):  # a no-LoRA engine would detach the tables just the same
        with pytest.raises(ModelInUse) as err:
            Engine(model, config(slots), abi.h_base, abi)
        assert err.value.code == "MODEL_IN_USE"
    assert {key: linear.factors for key, linear in first.runner.linears.items()} == tables
    assert greedy(first, handle) == before  # the adapter still applies
    assert before != greedy(first, None)
    del first, handle
    gc.collect()
    second = Engine(model, config(2), abi.h_base, abi)
    assert greedy(second, second.register_adapter(tiny_adapters["all_r8"])) == before
