"""Adapter registration: slots, digests, handles, and refusals that change nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dataplane.core import SamplingParams
from dataplane.engine.adapters import AdapterError
from dataplane.engine.engine import Engine


def _engine(model_dir: Path, max_slots: int = 2, max_rank: int = 8) -> Engine:
    return Engine.from_model_dir(model_dir, max_num_seqs=4, max_num_batched_tokens=32,
                                 num_kv_blocks=32, block_size=4, max_slots=max_slots,
                                 max_rank=max_rank)


def _tables_snapshot(engine: Engine) -> list[torch.Tensor]:
    return [t.storage.clone() for t in engine.runner.tables.values()] + [
        t.ranks.clone() for t in engine.runner.tables.values()]


def test_slots_handles_and_digests(tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    engine = _engine(tiny_llama)
    h1 = engine.register_adapter(tiny_adapters["attn_r4"])
    assert engine.register_adapter(tiny_adapters["attn_r4"]) == h1  # same content, same slot
    h2 = engine.register_adapter(tiny_adapters["mlp_rs2"])
    assert {h1.slot, h2.slot} == {0, 1} and h1.digest != h2.digest
    assert len(h1.digest) == 64 and h1.max_rank == 4
    before = _tables_snapshot(engine)
    with pytest.raises(AdapterError, match="no free adapter slot"):
        engine.register_adapter(tiny_adapters["all_r8"])
    assert all(torch.equal(a, b) for a, b in zip(before, _tables_snapshot(engine), strict=True))

    engine.add_request("busy", [1, 2, 3], SamplingParams(max_tokens=2), h2)
    with pytest.raises(AdapterError, match="live requests"):
        engine.unregister_adapter(h2)
    engine.abort("busy")
    engine.unregister_adapter(h2)
    with pytest.raises(AdapterError, match="stale"):
        engine.add_request("late", [1, 2], SamplingParams(max_tokens=2), h2)
    h3 = engine.register_adapter(tiny_adapters["all_r8"])
    assert h3.slot == h2.slot and h3.slot_generation == h2.slot_generation + 1


def test_rank_above_max_rank_is_refused_without_writes(tiny_llama: Path,
                                                       tiny_adapters: dict[str, Path]) -> None:
    engine = _engine(tiny_llama, max_rank=4)
    before = _tables_snapshot(engine)
    with pytest.raises(AdapterError) as info:
        engine.register_adapter(tiny_adapters["all_r8"])  # rank 8 > 4
    assert info.value.code == "ADAPTER_INVALID"
    assert all(torch.equal(a, b) for a, b in zip(before, _tables_snapshot(engine), strict=True))


def test_adapter_for_another_base_is_refused(tiny_llama: Path, tiny_adapters: dict[str, Path],
                                             tmp_path: Path) -> None:
    from dataplane.assets import make_tiny_llama

    other = make_tiny_llama(tmp_path / "wide", seed=0, hidden_size=96, intermediate_size=128)
    engine = _engine(other)
    with pytest.raises(AdapterError, match="rejected"):
        engine.register_adapter(tiny_adapters["attn_r4"])
    broken = tmp_path / "broken"
    shutil.copytree(tiny_adapters["attn_r4"], broken)
    (broken / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    with pytest.raises(AdapterError):
        _engine(tiny_llama).register_adapter(broken)


def test_lora_disabled_engine_refuses_adapters(tiny_llama: Path,
                                               tiny_adapters: dict[str, Path]) -> None:
    engine = _engine(tiny_llama, max_slots=0)
    with pytest.raises(AdapterError, match="disabled"):
        engine.register_adapter(tiny_adapters["attn_r4"])
    [out] = engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3))
    assert len(out.token_ids) == 3


def _expected_kernel_local(adapter_dir: Path, base_dir: Path, family: str, packing: str
                           ) -> str:
    """H_kernel_local built by hand from DESIGN.md §3's fields: every module whole (no
    shard), B stored transposed, TP shard 0 of 1."""
    from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir
    from dataplane.identity import digest, h_adapter_semantic

    artifact = validate_peft_dir(adapter_dir, read_base_abi(base_dir), ArtifactLimits())
    return str(digest({
        "h_adapter_semantic": h_adapter_semantic(artifact.h_base, artifact.h_artifact),
        "kernel_family": family, "conversion_revision": 1, "dtype": "float32",
        "packing": packing,
        "local_module_layouts": [
            {"name": m.name, "a_axes": ["rank", "input"], "b_axes": ["rank", "output"],
             "a_shard": None, "b_shard": None} for m in sorted(artifact.modules,
                                                              key=lambda m: m.name)],
        "parallel_shard": {"tp_rank": 0, "tp_size": 1}}))


@pytest.mark.parametrize("fold", [False, True])
def test_registered_slots_record_their_kernel_local_identity(
        tiny_llama: Path, tiny_adapters: dict[str, Path], fold: bool) -> None:
    engine = Engine.from_model_dir(tiny_llama, max_num_seqs=4, max_num_batched_tokens=32,
                                   num_kv_blocks=32, block_size=4, max_slots=2, max_rank=8,
                                   lora_fold=fold)
    family = engine.runner.backend.name + ("+fold" if fold else "")
    handle = engine.register_adapter(tiny_adapters["all_r8"])
    assert engine.adapters.kernel_local[handle.slot] == (
        _expected_kernel_local(tiny_adapters["all_r8"], tiny_llama, family, "stacked"),)
    other = engine.register_adapter(tiny_adapters["attn_r4"])
    assert engine.adapters.kernel_local[other.slot] != engine.adapters.kernel_local[handle.slot]
    engine.unregister_adapter(handle)
    assert handle.slot not in engine.adapters.kernel_local
