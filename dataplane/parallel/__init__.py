"""Tensor-parallel data plane: process groups, counted collectives, sharding.

Megatron-style: a rank runs the ordinary model at its local sizes with column-parallel
q/k/v and gate/up, row-parallel o and down (one all-reduce each), a vocab-parallel
embedding and LM head (`shard_model`); each adapter is sharded the same way into the rank's
own pool, adding no collective (`shard_model.shard_adapter`), and every rank's shard is
recorded in its H_kernel_local (`layout_identity`). Collectives are counted
(`collectives`). The engine runs the ranks in lockstep (dataplane/engine/lockstep.py);
agent/tp_ranks.py launches them.
"""

from __future__ import annotations

from dataplane.parallel.collectives import CollectiveCounter, TPGroup
from dataplane.parallel.errors import (
    IndivisibleShardError,
    ParallelError,
    ProcessGroupError,
    ShardShapeError,
    UnknownLayoutError,
)
from dataplane.parallel.process_group import (
    destroy_tp_group,
    init_tp_group,
    init_tp_group_from_env,
    single_rank_group,
)
from dataplane.parallel.publication import publish_when_all_valid, validate_local_shard
from dataplane.parallel.shard import COLUMN, ROW, LocalFactors, shard_lora_factors
from dataplane.parallel.vocab import ParallelLMHead, VocabParallelEmbedding

__all__ = [
    "COLUMN", "ROW", "CollectiveCounter", "IndivisibleShardError", "LocalFactors",
    "ParallelError", "ParallelLMHead", "ProcessGroupError", "ShardShapeError", "TPGroup",
    "UnknownLayoutError", "VocabParallelEmbedding", "destroy_tp_group", "init_tp_group",
    "init_tp_group_from_env", "publish_when_all_valid", "shard_lora_factors",
    "single_rank_group", "validate_local_shard",
]
