"""Adapter registration: slots, digests, handles, and refusals that change nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.adapters import AdapterError, AdapterHandle
from dataplane.engine.engine import Engine
from dataplane.pool.errors import AdmissionRefused


def _engine(model_dir: Path, max_slots: int = 2, max_rank: int = 8, pages: int = 32
            ) -> Engine:
    return build_engine(EngineSpec.of(model_dir, max_num_seqs=4, max_num_batched_tokens=32,
                                      num_kv_blocks=pages, block_size=4, max_slots=max_slots,
                                      max_rank=max_rank))


def _tables_snapshot(engine: Engine) -> list[torch.Tensor]:
    """The pool's bytes (KV and adapter pages) and every slot's published rank rows."""
    tables = engine.pool.tables
    return [engine.pool.pool.storage.backing.clone(), tables.scales.clone(),
            *(tables.weights(layer, attr).ranks.clone() for layer, attr in tables.groups)]


def test_slots_handles_and_digests(tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    engine = _engine(tiny_llama, pages=128)  # room for three adapters: slots run out first
    h1 = engine.register_adapter(tiny_adapters["attn_r4"])
    assert engine.register_adapter(tiny_adapters["attn_r4"]) == h1  # same content, same slot
    h2 = engine.register_adapter(tiny_adapters["mlp_rs2"])
    assert {h1.slot, h2.slot} == {0, 1} and h1.digest != h2.digest
    assert len(h1.digest) == 64 and h1.max_rank == 4
    before = _tables_snapshot(engine)
    with pytest.raises(AdmissionRefused) as refused:  # registered adapters are pinned
        engine.register_adapter(tiny_adapters["all_r8"])
    assert refused.value.detail.get("reason") == "no_free_slot", refused.value
    assert all(torch.equal(a, b) for a, b in zip(before, _tables_snapshot(engine), strict=True))

    engine.add_request("busy", [1, 2, 3], SamplingParams(max_tokens=2), h2)
    with pytest.raises(AdapterError, match="live requests"):
        engine.unregister_adapter(h2)
    engine.abort("busy")
    engine.unregister_adapter(h2)
    with pytest.raises(AdapterError, match="stale"):
        engine.add_request("late", [1, 2], SamplingParams(max_tokens=2), h2)
    h3 = engine.register_adapter(tiny_adapters["all_r8"])
    assert h3.slot == h2.slot and h3.slot_generation > h2.slot_generation


def test_evictable_adapters_give_way_to_loads_but_never_while_held(
        tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    from dataplane.engine.adapters import load_peft_adapter
    from dataplane.engine.observer import EngineObserver

    engine = _engine(tiny_llama, pages=128)
    evicted: list[str] = []

    class Heard(EngineObserver):
        def adapter_evicted(self, key: str) -> None:
            evicted.append(key)

    engine.observers.append(Heard())
    abi = engine.base_abi
    assert abi is not None

    def load(name: str) -> AdapterHandle:
        return engine.register_loaded_adapter(load_peft_adapter(tiny_adapters[name], abi, 8),
                                              key=name, evictable=True)

    h1, h2 = load("attn_r4"), load("mlp_rs2")
    engine.add_request("busy", [1, 2, 3], SamplingParams(max_tokens=2), h2)
    h3 = load("all_r8")  # both slots taken: the idle one (h1) is the victim, never h2
    assert h3.slot == h1.slot and evicted == ["attn_r4"]
    with pytest.raises(AdapterError, match="stale"):
        engine.add_request("late", [1, 2], SamplingParams(max_tokens=2), h1)
    engine.add_request("busy3", [1, 2, 3], SamplingParams(max_tokens=2), h3)
    before = _tables_snapshot(engine)
    with pytest.raises(AdmissionRefused) as refused:  # both slots held by live requests
        load("attn_r4")
    assert refused.value.detail.get("reason") == "no_free_slot", refused.value
    assert all(torch.equal(a, b) for a, b in zip(before, _tables_snapshot(engine), strict=True))
    assert evicted == ["attn_r4"]


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
    """H_kernel_local built by hand from the fields docs/ARCHITECTURE.md ("Identities")
    lists: every module whole (no shard), B stored transposed, TP shard 0 of 1."""
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
    engine = build_engine(EngineSpec.of(tiny_llama, max_num_seqs=4, max_num_batched_tokens=32,
                                   num_kv_blocks=128, block_size=4, max_slots=2, max_rank=8,
                                   lora_fold="on" if fold else "off"))
    family = engine.runner.backend.name + ("+fold" if fold else "")
    handle = engine.register_adapter(tiny_adapters["all_r8"])
    assert engine.adapters.kernel_local[handle.slot] == (
        _expected_kernel_local(tiny_adapters["all_r8"], tiny_llama, family, "paged"),)
    other = engine.register_adapter(tiny_adapters["attn_r4"])
    assert engine.adapters.kernel_local[other.slot] != engine.adapters.kernel_local[handle.slot]
    engine.unregister_adapter(handle)
    assert handle.slot not in engine.adapters.kernel_local
