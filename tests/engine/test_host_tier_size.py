"""The engine's host tier is the size its config (and the agent's `host_tier_mib`) says:
what does not fit is evicted least recently used first, and a bad size is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentSettings
from agent.engine_factory import engine_config
from dataplane.core import InvalidRequest
from dataplane.engine import Engine, EngineConfig, EngineSpec, build_engine
from dataplane.engine.builder import load_base


def _engine(model_dir: Path, host_tier_bytes: int = EngineConfig.host_tier_bytes) -> Engine:
    return build_engine(EngineSpec(load_base(model_dir), EngineConfig(
        max_slots=2, max_rank=8, num_kv_blocks=256, enable_cuda_graphs=False,
        host_tier_bytes=host_tier_bytes)))


def test_the_host_tier_keeps_what_fits_and_evicts_the_least_recent(
        tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    roomy = _engine(tiny_llama)
    sizes = []
    for name in ("attn_r4", "all_r8"):
        before = roomy.pool.host.used_bytes
        roomy.register_adapter(tiny_adapters[name])
        sizes.append(roomy.pool.host.used_bytes - before)
    assert all(size > 0 for size in sizes)
    assert roomy.pool.host.evictions == 0

    budget = max(sizes) + 1  # one adapter at a time
    tight = _engine(tiny_llama, host_tier_bytes=budget)
    host = tight.pool.host
    assert host.byte_budget == budget
    first = tight.register_adapter(tiny_adapters["attn_r4"])
    second = tight.register_adapter(tiny_adapters["all_r8"])
    assert host.evictions == 1
    assert len(host) == 1 and host.used_bytes == sizes[1]
    assert first.digest not in host and second.digest in host
    # both are still served from their device slots
    assert {first.slot, second.slot} == {0, 1}


def test_a_host_tier_size_below_one_byte_is_refused() -> None:
    with pytest.raises(InvalidRequest) as caught:
        EngineConfig(host_tier_bytes=0)
    assert caught.value.code == "INVALID_REQUEST"
    assert "host_tier_bytes" in caught.value.message


def test_the_agent_setting_sizes_the_engine_host_tier(tiny_llama: Path) -> None:
    settings = AgentSettings(model_dir=tiny_llama, host_tier_mib=3)
    assert engine_config(settings).host_tier_bytes == 3 << 20
    assert engine_config(AgentSettings(model_dir=tiny_llama)).host_tier_bytes == 1 << 30
