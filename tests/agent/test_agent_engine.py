"""The agent's engine from its settings (agent/engine_factory.py): one `build_engine` call,
metrics as an observer. Its pool serves the adapters it holds, a slot freed by one adapter
and reused by another serves the new one, a launch naming the freed slot's old pool
handle is refused, and the fold and piecewise-graph settings reach the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentSettings
from agent.engine_factory import agent_engine
from agent.metrics import AgentMetrics
from agent.plan_metrics import PlanMetrics
from dataplane.core import SamplingParams
from dataplane.engine.adapters import AdapterHandle, load_peft_adapter
from dataplane.pool.errors import StaleGeneration

from .assets import GreedyReference
from .conftest import AGENT_MAX_RANK, AgentAssets

PROMPT = [21, 22, 23]
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def _settings(assets: AgentAssets, tmp_path: Path, **extra: object) -> AgentSettings:
    return AgentSettings(model_dir=assets.base, max_slots=3, max_rank=AGENT_MAX_RANK,
                         num_kv_blocks=64, cache_dir=tmp_path, **extra)  # type: ignore[arg-type]


def test_slots_serve_the_adapter_they_hold(agent_assets: AgentAssets,
                                           reference: GreedyReference, tmp_path: Path) -> None:
    metrics = AgentMetrics()
    engine, ranks = agent_engine(_settings(agent_assets, tmp_path), metrics)
    assert ranks is None and any(isinstance(o, PlanMetrics) for o in engine.observers)
    abi = engine.base_abi
    assert abi is not None

    def load(name: str) -> AdapterHandle:
        adapter = load_peft_adapter(agent_assets.adapters[name], abi, AGENT_MAX_RANK)
        return engine.register_loaded_adapter(adapter, key=name, evictable=True)

    def run(handle: AdapterHandle | None) -> list[int]:
        return list(engine.generate([PROMPT], PARAMS, [handle])[0].token_ids)

    handles = {n: load(n) for n in ("a", "b", "c")}
    for name, handle in handles.items():
        assert run(handle) == reference.greedy(PROMPT, 4, name)
    old_b = handles.pop("b")
    stale = engine.pool.pool_handle(old_b)
    engine.unregister_adapter(old_b)
    handles["d"] = load("d")
    assert handles["d"].slot == old_b.slot
    for name, handle in handles.items():
        assert run(handle) == reference.greedy(PROMPT, 4, name)
    assert run(None) == reference.greedy(PROMPT, 4, None)
    assert stale.artifact_digest == "b"
    with pytest.raises(StaleGeneration):  # b's handle never validates again (ABA)
        engine.pool.pool.begin_launch([stale])
    engine.pool.pool.check()
    rows = metrics.rows.labels("decode").collect()[0].samples  # the observer saw every plan
    assert any(s.name.endswith("_count") and s.value > 0 for s in rows)


def test_fold_setting_reaches_the_engine_and_serves_the_same_tokens(
        agent_assets: AgentAssets, reference: GreedyReference, tmp_path: Path) -> None:
    """`on` folds decode steps (same greedy tokens as HF + PEFT); `auto` on the CPU and
    `off` keep the launches."""
    for fold, folded in (("on", True), ("off", False), ("auto", False)):
        engine, _ = agent_engine(_settings(agent_assets, tmp_path, lora_fold=fold),
                                 AgentMetrics())
        assert (engine.model.lora_fold_slots is not None) is folded, fold
        abi = engine.base_abi
        assert abi is not None
        handle = engine.register_loaded_adapter(
            load_peft_adapter(agent_assets.adapters["a"], abi, AGENT_MAX_RANK), key="a")
        out = engine.generate([PROMPT, PROMPT], PARAMS, [handle, None])
        assert [list(o.token_ids) for o in out] == [reference.greedy(PROMPT, 4, "a"),
                                                    reference.greedy(PROMPT, 4, None)]
        if folded:
            assert all(linear.fold is not None and linear.fold.uses > 0
                       for linear in engine.runner.linears.values())
        del engine


def test_piecewise_graphs_setting_reaches_the_engine(agent_assets: AgentAssets,
                                                     tmp_path: Path) -> None:
    """`ADAPTERPLANE_AGENT_PIECEWISE_GRAPHS` turns the engine option on (captured on CUDA
    only; on CPU the option is recorded and nothing is)."""
    for on in (False, True):
        engine, _ = agent_engine(_settings(agent_assets, tmp_path, piecewise_graphs=on),
                                 AgentMetrics())
        assert engine.config.enable_piecewise_graphs is on
        assert engine.runner.piecewise is None  # CPU: no capture


def test_default_cpu_pool_keeps_its_kv_blocks_beside_full_slots(
        agent_assets: AgentAssets, tmp_path: Path) -> None:
    """Left unset on the CPU, `num_kv_blocks` is the KV left when every slot holds a
    worst-case adapter (max rank, every target); set, it is the pool's page count."""
    from dataplane.assets import make_peft_adapter

    worst = make_peft_adapter(agent_assets.base, tmp_path / "worst", seed=9,
                              rank=AGENT_MAX_RANK, alpha=16,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                              "gate_proj", "up_proj", "down_proj"])
    settings = AgentSettings(model_dir=agent_assets.base, max_slots=3,
                             max_rank=AGENT_MAX_RANK, cache_dir=tmp_path)
    engine, _ = agent_engine(settings, AgentMetrics())
    abi = engine.base_abi
    assert abi is not None
    adapter = load_peft_adapter(worst, abi, AGENT_MAX_RANK)
    for i in range(settings.max_slots):
        engine.register_loaded_adapter(adapter, key=f"worst-{i}", evictable=True)
    counts = engine.pool.pool.pages.counts()
    assert counts.adapter > 0 and counts.free == settings.num_kv_blocks == 512
    del engine
    explicit, _ = agent_engine(_settings(agent_assets, tmp_path / "explicit"), AgentMetrics())
    assert explicit.pool.pool.pages.counts().total == 64
