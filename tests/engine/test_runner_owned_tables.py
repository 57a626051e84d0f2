"""ModelRunner hook for tensor-parallel projections: a LoRA linear whose
`owns_lora_tables` is True keeps its own factor table; the runner neither replaces it nor
registers it, and adapters registered through the engine never write into it."""

from __future__ import annotations

from pathlib import Path

import torch

from dataplane.core import SamplingParams
from dataplane.engine.engine import Engine, EngineConfig
from dataplane.kernels import LoraFactorTable
from dataplane.models import load_model

OWNED = (0, "o_proj")


def test_runner_leaves_owned_tables_alone(tiny_llama: Path,
                                          tiny_adapters: dict[str, Path]) -> None:
    from dataplane.artifacts import read_base_abi

    model = load_model(tiny_llama, torch.float32, torch.device("cpu"))
    linear = model.layers[OWNED[0]].o_proj
    own = LoraFactorTable(2, linear.in_features, linear.out_features, 8, torch.float32, "cpu")
    linear.owns_lora_tables = True  # type: ignore[union-attr]
    linear.factors = own  # type: ignore[union-attr]
    abi = read_base_abi(tiny_llama)
    engine = Engine(model, EngineConfig(max_num_seqs=2, num_kv_blocks=16, block_size=4,
                                        max_slots=2, max_rank=8), abi.h_base, abi)
    runner = engine.runner
    assert linear.factors is own  # type: ignore[union-attr]
    assert OWNED not in runner.tables and OWNED not in runner.linears
    assert len(runner.tables) == len(model.lora_linears()) - 1
    other = model.layers[1].o_proj
    assert other.factors is runner.tables[(1, "o_proj")]  # type: ignore[union-attr]
    # attn_r4 targets q/v only, so it loads; the owned table stays empty.
    handle = engine.register_adapter(tiny_adapters["attn_r4"])
    assert not own.ranks.any()
    out = engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2,
                                                      ignore_eos=True), [handle])
    assert len(out[0].token_ids) == 2
    assert linear.factors is own  # type: ignore[union-attr]
