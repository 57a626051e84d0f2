"""Build the agent's engine: the public `Engine` plus per-iteration plan metrics.

:class:`MeteredEngine` observes each step's `BatchPlan` (rows and requests by phase,
distinct adapters, rank padding) at the point the plan is selected (seed §0x09K
`iteration_selected`) and fences its launch through the slot backend; it changes nothing
about execution. Async scheduling follows the engine default: on exactly when CUDA
graphs are captured (CUDA), synchronous on CPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agent.config import AgentSettings
from agent.metrics import AgentMetrics
from agent.slot_backends import EngineSlots, PoolSlots, SlotBackend
from dataplane.artifacts import read_base_abi
from dataplane.core import BatchPlan
from dataplane.engine.engine import Engine, EngineConfig
from dataplane.models import load_model
from dataplane.models.llama import LORA_GROUPS
from dataplane.parallel.cost_model import LayoutDecision
from dataplane.parallel.tp_engine import TPEngine
from dataplane.pool.errors import StaleGeneration
from dataplane.pool.faults import FaultInjector
from dataplane.tokenizer import Tokenizer

log = logging.getLogger("adapterplane.agent")


@dataclass(frozen=True)
class _Fence:
    """One launch fenced through a slot backend: `snap` is what its `begin_launch`
    returned (None when the plan reads no adapter slot); closed by `end_launch(snap)`."""

    slots: SlotBackend
    snap: Any


class MeteredEngine(Engine):
    """`Engine` that reports plan shape to `metrics` and fences each launch through
    its slot backend (both set by :func:`build_engine`).

    Both through the engine's plan hooks, so the sync and the async loop work alike: a
    plan's fence opens (`begin_launch`, which refuses stale slot generations) when the
    plan is launched and closes (`end_launch`, recording the event that marks the plan's
    last use of its slots) when it is retired — with async scheduling that is after the
    *next* step was launched, so the pool never reclaims a slot an in-flight plan reads.
    Every `begin_launch` gets exactly one `end_launch`."""

    metrics: AgentMetrics | None = None
    slots: SlotBackend | None = None
    slot_ranks: dict[int, int]
    """slot -> the true (largest) rank of the adapter in it; kept by the engine loop."""

    def on_plan_launched(self, plan: BatchPlan) -> object:
        if self.metrics is not None:
            self._observe(plan)
        slots = self.slots
        if slots is None:
            return None
        try:
            return _Fence(slots, slots.begin_launch(plan.row_slot))
        except StaleGeneration:  # a handle names a reclaimed slot: refuse the launch
            if self.metrics is not None:
                self.metrics.slot_generation_mismatch.inc()
            raise

    def on_plan_retired(self, token: object) -> None:
        if isinstance(token, _Fence):
            token.slots.end_launch(token.snap)

    def _observe(self, plan: BatchPlan) -> None:
        m = self.metrics
        assert m is not None
        doff = plan.doff
        m.rows.labels("prefill").observe(doff)
        m.rows.labels("decode").observe(plan.num_rows - doff)
        m.requests_per_iter.labels("prefill").observe(plan.num_prefills)
        m.requests_per_iter.labels("decode").observe(plan.num_decodes)
        adapted = [s for s in plan.row_slot if s >= 0]
        m.distinct.observe(len(set(adapted)))
        ranks = getattr(self, "slot_ranks", {})
        true = sum(ranks.get(s, 0) for s in adapted)
        if true:
            m.padding_ratio.set(len(adapted) * self.config.max_rank / true)


class MeteredTPEngine(MeteredEngine, TPEngine):
    """Rank 0 of this node's tensor-parallel group, metered like the single-GPU engine."""


def tp_lora_layouts(settings: AgentSettings) -> dict[str, LayoutDecision | str]:
    """Each fused projection's LoRA layout for the agent's TP group: the setting, or with
    `auto` the cost model's decision for this agent's sizes (rank `max_rank`, `max_num_seqs`
    rows, up to `min(max_slots, max_num_seqs)` distinct adapters per step, `max_slots`
    resident)."""
    if settings.tp_lora_layout != "auto":
        return dict.fromkeys(LORA_GROUPS, settings.tp_lora_layout)
    from dataplane.models.config import ModelConfig
    from dataplane.parallel.llama_tp import auto_lora_layouts

    decisions = auto_lora_layouts(
        ModelConfig.from_model_dir(settings.model_dir), settings.tp_degree,
        rank=settings.max_rank, tokens=settings.max_num_seqs,
        active_adapters=min(settings.max_slots, settings.max_num_seqs),
        resident_adapters=settings.max_slots,
        dtype_bytes=torch.finfo(getattr(torch, settings.dtype)).bits // 8,
        extra_resident_budget_bytes=settings.tp_lora_extra_resident_bytes)
    return dict(decisions)


def lora_fold(settings: AgentSettings) -> bool:
    """The `lora_fold` setting, or with `auto` the fold cost model's decision."""
    if settings.lora_fold != "auto":
        return settings.lora_fold == "on"
    from dataplane.models.config import ModelConfig
    from dataplane.parallel.fold_cost import decide_fold

    decision = decide_fold(ModelConfig.from_model_dir(settings.model_dir), settings.tp_degree,
                           rank=settings.max_rank, max_slots=settings.max_slots,
                           max_num_seqs=settings.max_num_seqs,
                           dtype_bytes=torch.finfo(getattr(torch, settings.dtype)).bits // 8,
                           extra_resident_budget_bytes=settings.tp_lora_extra_resident_bytes)
    log.info("LoRA fold: %s (%s)", "on" if decision.fold else "off", decision.reason)
    return decision.fold


def _layout(choice: LayoutDecision | str) -> str:
    return choice if isinstance(choice, str) else choice.layout


def _build_tp_engine(settings: AgentSettings, sizes: dict[str, int]) -> MeteredEngine:
    """Spawn ranks 1..N-1 (agent/tp_ranks.py); this process is rank 0."""
    if settings.residency_backend != "engine":
        raise ValueError("tp_degree > 1 needs residency_backend='engine' "
                         "(TP ranks hold sharded factor tables)")
    from agent.tp_ranks import TPLaunchSpec, launch_tp_ranks

    choices = tp_lora_layouts(settings)
    for attr, choice in choices.items():
        log.info("TP LoRA layout of %s: %s%s", attr, _layout(choice),
                 "" if isinstance(choice, str) else f" ({choice.reason})")
    engine_sizes: dict[str, object] = {
        **sizes, "enable_piecewise_graphs": settings.piecewise_graphs}
    ranks = launch_tp_ranks(TPLaunchSpec(str(settings.model_dir), settings.tp_degree,
                                         device=settings.device, dtype=settings.dtype,
                                         lora_layouts={a: _layout(c) for a, c in choices.items()},
                                         lora_fold=lora_fold(settings),
                                         engine_sizes=engine_sizes),
                            engine_cls=MeteredTPEngine)
    engine = ranks.engine
    assert isinstance(engine, MeteredEngine)
    engine.tp_ranks = ranks  # type: ignore[attr-defined]
    engine.slots = EngineSlots(engine)
    return engine


def build_engine(settings: AgentSettings, metrics: AgentMetrics,
                 faults: FaultInjector | None = None) -> MeteredEngine:
    """The agent's engine. `pool` backend: one unified pool of `num_kv_blocks` pages
    (engine KV block i == pool page i) holding KV blocks and adapter factors in one device
    buffer (the engine's KV cache is views of the pool's pages)."""
    sizes = dict(max_slots=settings.max_slots, max_rank=settings.max_rank,
                 num_kv_blocks=settings.num_kv_blocks, block_size=settings.block_size,
                 max_num_seqs=settings.max_num_seqs,
                 max_num_batched_tokens=settings.max_num_batched_tokens)
    engine: MeteredEngine
    if settings.collection_blocks and settings.tp_degree > 1:
        raise ValueError("collection_blocks needs one GPU (the collection tables are not "
                         "sharded)")
    if settings.tp_degree > 1:
        engine = _build_tp_engine(settings, sizes)
    elif settings.residency_backend == "engine":
        single = MeteredEngine.from_model_dir(
            settings.model_dir, dtype=settings.dtype, device=settings.device,
            enable_piecewise_graphs=settings.piecewise_graphs,
            lora_fold=lora_fold(settings), collection_blocks=settings.collection_blocks,
            collection_rank=settings.collection_rank, **sizes)
        assert isinstance(single, MeteredEngine)
        engine = single
        engine.slots = EngineSlots(engine)
    else:
        path = Path(settings.model_dir)
        model = load_model(path, getattr(torch, settings.dtype), torch.device(settings.device))
        abi = read_base_abi(path)
        tokenizer = (Tokenizer.from_dir(path) if (path / "tokenizer.json").is_file()
                     else None)
        # natively served collection members take `max_slots` slots of their own above
        # the pool's (they hold no pages)
        members = settings.max_slots if settings.collection_blocks else 0
        slots = PoolSlots.for_model(model, num_pages=settings.num_kv_blocks,
                                    block_size=settings.block_size,
                                    max_slots=settings.max_slots, max_rank=settings.max_rank,
                                    faults=faults or FaultInjector.from_env(),
                                    member_slots=members)
        # graphs are captured after the linears point at the pool's address tables
        config = EngineConfig(**{**sizes, "max_slots": settings.max_slots + members},  # type: ignore[arg-type]
                              enable_cuda_graphs=False,
                              enable_piecewise_graphs=settings.piecewise_graphs,
                              external_factors=True,
                              collection_blocks=settings.collection_blocks,
                              collection_rank=settings.collection_rank)
        engine = MeteredEngine(model, config, abi.h_base, abi, tokenizer,
                               kv_pages=slots.kv_view, kv_cache=slots.kv_cache)
        slots.attach(engine)
        if settings.max_slots > 0 and lora_fold(settings):
            slots.enable_fold()
        engine.slots = slots
        engine.capture_cuda_graphs()
    engine.slot_ranks = {}
    engine.metrics = metrics
    return engine
