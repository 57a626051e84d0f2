"""`ADAPTERPLANE_AGENT_LORA_FOLD` on one GPU with engine residency: the agent's engine folds
decode steps' LoRA and serves the unfolded engine's greedy tokens (the unified pool's fold:
test_pool_fold.py)."""

from __future__ import annotations

from pathlib import Path

from agent.config import AgentSettings
from agent.engine_factory import build_engine
from agent.metrics import AgentMetrics
from dataplane.engine import Engine

from .test_tp_ranks import SIZES, assets, greedy  # noqa: F401 - fixture


def _settings(base: Path, **extra: object) -> AgentSettings:
    sizes = {k: SIZES[k] for k in ("max_num_seqs", "max_num_batched_tokens", "num_kv_blocks",
                                   "block_size", "max_slots", "max_rank")}
    return AgentSettings(model_dir=base, device="cpu", dtype="float32",  # type: ignore[arg-type]
                         **sizes, **extra)


def test_engine_residency_agent_folds_and_serves_the_same_tokens(
        assets: tuple[Path, dict[str, Path]]) -> None:  # noqa: F811
    base, adapters = assets
    reference = greedy(Engine.from_model_dir(base, dtype="float32", device="cpu", **SIZES),
                       adapters)
    engine = build_engine(_settings(base, residency_backend="engine"), AgentMetrics())
    assert engine.model.lora_fold_rows == SIZES["max_num_seqs"]  # `auto`: no idle slot
    assert greedy(engine, adapters) == reference
    assert all(linear.fold is not None and linear.fold.uses > 0
               for linear in engine.runner.linears.values())
    off = build_engine(_settings(base, residency_backend="engine", lora_fold="off"),
                       AgentMetrics())
    assert off.model.lora_fold_rows == 0

