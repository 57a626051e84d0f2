"""Tensor-parallel data plane: process groups, parallel linears with sharded LoRA.

Megatron-style: column-parallel q/k/v and gate/up, row-parallel o and down, vocab-parallel
embedding and LM head; the LoRA branch in two layouts ("paper", the S-LoRA paper's
schedule, and our default "no_extra_collectives"), chosen per module by
`cost_model.decide_layout` and recorded in H_kernel_local (`layout_identity`).
Collectives are counted (`collectives`).

Serving (imported explicitly, not re-exported): `tp_engine.TPEngine` runs the real Engine
on every rank in lockstep (rank 0 schedules, samples and broadcasts each plan over
`control.ControlChannel`; under async scheduling the sampled tokens follow as one device
broadcast), `tp_graphs.TPCudaGraphRunner` captures each rank's decode step and
`tp_piecewise.TPPiecewiseGraphRunner` its mixed steps' pieces, with their NCCL collectives,
counted per replay. agent/tp_ranks.py launches the ranks.
"""

from __future__ import annotations

from dataplane.parallel.collectives import CollectiveCounter, TPGroup
from dataplane.parallel.cost_model import LayoutDecision, ModuleTraffic, decide_layout
from dataplane.parallel.errors import (
    IndivisibleShardError,
    ParallelError,
    ProcessGroupError,
    ShardShapeError,
    UnknownLayoutError,
)
from dataplane.parallel.linear import ColumnParallelLinear, RowParallelLinear
from dataplane.parallel.lora_tp import ShardedLoraBranch
from dataplane.parallel.process_group import (
    destroy_tp_group,
    init_tp_group,
    init_tp_group_from_env,
    single_rank_group,
)
from dataplane.parallel.publication import publish_when_all_valid, validate_local_shard
from dataplane.parallel.shard import (
    COLUMN,
    LAYOUT_LOCAL,
    LAYOUT_PAPER,
    ROW,
    LocalFactors,
    shard_lora_factors,
)
from dataplane.parallel.vocab import ParallelLMHead, VocabParallelEmbedding

__all__ = [
    "COLUMN", "LAYOUT_LOCAL", "LAYOUT_PAPER", "ROW", "CollectiveCounter",
    "ColumnParallelLinear", "IndivisibleShardError", "LayoutDecision", "LocalFactors",
    "ModuleTraffic", "ParallelError", "ParallelLMHead", "ProcessGroupError",
    "RowParallelLinear", "ShardShapeError", "ShardedLoraBranch", "TPGroup",
    "UnknownLayoutError", "VocabParallelEmbedding", "decide_layout", "destroy_tp_group",
    "init_tp_group", "init_tp_group_from_env", "publish_when_all_valid",
    "shard_lora_factors", "single_rank_group", "validate_local_shard",
]
