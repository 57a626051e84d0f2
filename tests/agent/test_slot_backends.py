"""Both slot backends in-process on the real engine: outputs equal HF + PEFT, a slot
freed by one adapter and reused by another serves the new one, and (pool) a launch
naming the freed slot's old handle is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentSettings
from agent.engine_factory import build_engine
from agent.metrics import AgentMetrics
from agent.slot_backends import PoolSlots
from dataplane.core import SamplingParams
from dataplane.engine.adapters import load_peft_adapter
from dataplane.pool.errors import StaleGeneration

from .assets import GreedyReference
from .conftest import AGENT_MAX_RANK, AgentAssets

PROMPT = [21, 22, 23]
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.mark.parametrize("backend", ["pool", "engine"])
def test_slots_serve_the_adapter_they_hold(backend: str, agent_assets: AgentAssets,
                                           reference: GreedyReference, tmp_path: Path) -> None:
    settings = AgentSettings(model_dir=agent_assets.base, max_slots=3, max_rank=AGENT_MAX_RANK,
                             num_kv_blocks=64, residency_backend=backend,  # type: ignore[arg-type]
                             cache_dir=tmp_path)
    engine = build_engine(settings, AgentMetrics())
    slots = engine.slots
    assert slots is not None and isinstance(slots, PoolSlots) == (backend == "pool")
    abi = engine.base_abi
    assert abi is not None

    def load(name: str):  # type: ignore[no-untyped-def]
        adapter = load_peft_adapter(agent_assets.adapters[name], abi, AGENT_MAX_RANK)
        return slots.load(name, adapter)

    def run(handle: object) -> list[int]:
        return list(engine.generate([PROMPT], PARAMS, [handle])[0].token_ids)  # type: ignore[list-item]

    handles = {n: load(n) for n in ("a", "b", "c")}
    for name, handle in handles.items():
        assert run(handle) == reference.greedy(PROMPT, 4, name)
    old_b = handles.pop("b")
    stale = slots.pool_handle(old_b) if isinstance(slots, PoolSlots) else None
    slots.unload(old_b)
    handles["d"] = load("d")
    assert handles["d"].slot == old_b.slot
    for name, handle in handles.items():
        assert run(handle) == reference.greedy(PROMPT, 4, name)
    assert run(None) == reference.greedy(PROMPT, 4, None)
    if isinstance(slots, PoolSlots):
        assert stale is not None and stale.artifact_digest == "b"
        with pytest.raises(StaleGeneration):  # b's handle never validates again (ABA)
            slots.pool.begin_launch([stale])
        slots.pool.check()


@pytest.mark.parametrize("backend", ["pool", "engine"])
def test_piecewise_graphs_setting_reaches_the_engine(backend: str, agent_assets: AgentAssets,
                                                     tmp_path: Path) -> None:
    """`ADAPTERPLANE_AGENT_PIECEWISE_GRAPHS` turns the engine option on for both slot
    backends (captured on CUDA only; on CPU the option is recorded and nothing is)."""
    for on in (False, True):
        settings = AgentSettings(model_dir=agent_assets.base, max_slots=3,
                                 max_rank=AGENT_MAX_RANK, num_kv_blocks=64,
                                 residency_backend=backend,  # type: ignore[arg-type]
                                 cache_dir=tmp_path, piecewise_graphs=on)
        engine = build_engine(settings, AgentMetrics())
        assert engine.config.enable_piecewise_graphs is on
        assert engine.runner.piecewise is None  # CPU: no capture
