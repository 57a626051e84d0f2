"""The agent's engine, from its settings: one `build_engine` call (or, with `tp_degree`
> 1, this node's TP group, whose rank 0 runs here), with the agent's metrics subscribed
as an observer. The agent adds the network, the catalog and metrics around it; it does
not assemble the engine's internals (dataplane/engine/builder.py does).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.config import AgentSettings
from agent.metrics import AgentMetrics
from agent.plan_metrics import PlanMetrics
from dataplane.engine import Engine, EngineConfig, EngineSpec, build_engine
from dataplane.pool.faults import FaultInjector

if TYPE_CHECKING:
    from agent.tp_ranks import TPRanks

log = logging.getLogger("adapterplane.agent")


def pool_pages(settings: AgentSettings) -> int:
    """The unified pool's pages: `num_kv_blocks`, plus on the CPU, unless `num_kv_blocks`
    was set, room for `max_slots` adapters of `max_rank` on every target (the setting's
    docstring says why)."""
    if "num_kv_blocks" in settings.model_fields_set or not settings.device.startswith("cpu"):
        return settings.num_kv_blocks
    from dataplane.engine.builder import DTYPES, model_config
    from dataplane.pool.unified import adapter_room_pages

    room = adapter_room_pages(model_config(settings.model_dir), block_size=settings.block_size,
                              elem_bytes=DTYPES[settings.dtype].itemsize,
                              rank=settings.max_rank, slots=settings.max_slots)
    return settings.num_kv_blocks + room


def engine_config(settings: AgentSettings) -> EngineConfig:
    """The engine's sizes from the agent's settings."""
    return EngineConfig(max_slots=settings.max_slots, max_rank=settings.max_rank,
                        num_kv_blocks=pool_pages(settings), block_size=settings.block_size,
                        max_num_seqs=settings.max_num_seqs,
                        max_num_batched_tokens=settings.max_num_batched_tokens,
                        scheduling_policy=settings.scheduling_policy,
                        enable_piecewise_graphs=settings.piecewise_graphs,
                        collection_blocks=settings.collection_blocks,
                        collection_rank=settings.collection_rank,
                        host_tier_bytes=settings.host_tier_mib << 20)


def engine_spec(settings: AgentSettings, faults: FaultInjector | None = None) -> EngineSpec:
    """What `build_engine` makes of this agent's settings (one device)."""
    return EngineSpec(settings.model_dir, engine_config(settings), dtype=settings.dtype,
                      device=settings.device, lora_fold=settings.lora_fold,
                      faults=faults, extra_resident_bytes=settings.tp_lora_extra_resident_bytes)


def launch_tp_group(settings: AgentSettings) -> TPRanks:
    """Spawn ranks 1..N-1 (agent/tp_ranks.py); this process is rank 0."""
    from agent.tp_ranks import TPLaunchSpec, launch_tp_ranks

    if settings.collection_blocks:
        raise ValueError("collection_blocks needs one GPU (the collection tables are not "
                         "sharded)")
    return launch_tp_ranks(TPLaunchSpec(
        str(settings.model_dir), settings.tp_degree, device=settings.device,
        dtype=settings.dtype, lora_fold=settings.lora_fold, engine=engine_config(settings),
        extra_resident_bytes=settings.tp_lora_extra_resident_bytes))


def agent_engine(settings: AgentSettings, metrics: AgentMetrics,
                 faults: FaultInjector | None = None) -> tuple[Engine, TPRanks | None]:
    """The agent's engine (rank 0's under TP, with the group's ranks) with its metrics
    subscribed."""
    ranks = None
    if settings.tp_degree > 1:
        ranks = launch_tp_group(settings)
        engine: Engine = ranks.engine
    else:
        engine = build_engine(engine_spec(settings, faults or FaultInjector.from_env()))
    engine.observers.append(PlanMetrics(metrics, settings.max_rank))
    return engine, ranks
