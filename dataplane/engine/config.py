"""EngineConfig: the sizes and switches of one `Engine`, validated on construction.

Torch-free. `EngineSpec` (engine/builder.py) carries one, with the model and device.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.core import InvalidRequest
from dataplane.engine.fairness import POLICIES

DEFAULT_HOST_TIER_BYTES = 1 << 30
"""`EngineConfig.host_tier_bytes` unless set: 1 GiB."""


@dataclass(frozen=True)
class EngineConfig:
    """Sizes of one engine. `num_kv_blocks` x `block_size` tokens of KV for all requests."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_kv_blocks: int = 1024
    block_size: int = 16
    max_slots: int = 8
    max_rank: int = 16
    """Largest LoRA rank a slot may hold; 0 with `collection_blocks` > 0: an engine serving
    only collection members (no LoRA factor tables, no LoRA launches)."""
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_cuda_graphs: bool = True
    lora_backend: str | None = None
    attention_backend: str | None = None
    ops_backend: str | None = None
    max_graph_context: int = 4096
    enable_piecewise_graphs: bool = True
    """Also capture mixed (prefill + decode) steps as piecewise CUDA graphs around attention
    (engine/piecewise_graphs.py; rows padded to buckets of 64, 256 above 1,024). Only where
    decode graphs are captured (CUDA, `enable_cuda_graphs`, one rank)."""
    lora_fold: bool = False
    """Decode steps (up to `max_num_seqs` rows) fold the LoRA into the base GEMMs and their
    consumer ops: no LoRA launch, one more copy of the factors of
    `min(max_slots, max_num_seqs)` adapters, filled from the pool's pages
    (`PoolSlots.enable_fold`). `build_engine` decides it by the fold cost model unless
    told."""
    collection_blocks: int = 0
    """Compress-then-Serve members served natively (engine/collection_slots.py): basis
    blocks resident at once (one per loaded collection cluster); 0 = off. Members take
    `max_slots` slots of their own, above the pool's LoRA slots (they hold no pages).
    Costs three small GEMMs per projection on every step that
    can read a member (all graph-captured steps once it is on)."""
    collection_rank: int = 32
    """The shared rank R of every basis block (a collection fitted at a smaller R fits)."""
    sampler_seed: int | None = 0
    async_scheduling: bool | None = None
    """Launch the next step before syncing on this one's tokens (None: on
    exactly when CUDA graphs are in use; True also runs the same control flow on CPU)."""
    host_tier_bytes: int = DEFAULT_HOST_TIER_BYTES
    """Host memory (pinned on CUDA) for the packed images of adapters loaded before (pool
    page layout), least recently used evicted first: loading an adapter whose image is
    here again copies it to the device as it is, without packing its factors again."""
    scheduling_policy: str = "fair"
    """Which waiting request is admitted first: "fair" (the priority class, then the tenant
    with the least completed service per weight, then age; engine/fairness.py) or "fcfs"
    (arrival order)."""

    def __post_init__(self) -> None:
        minimum = {"max_num_seqs": 1, "max_num_batched_tokens": 1, "num_kv_blocks": 1,
                   "block_size": 1, "max_slots": 0, "max_rank": 0, "max_graph_context": 1,
                   "collection_blocks": 0, "collection_rank": 1, "host_tier_bytes": 1}
        for name, low in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidRequest(f"{name} must be an int >= {low}", **{name: value})
        if self.max_slots > 0 and self.max_rank == 0 and self.collection_blocks == 0:
            raise InvalidRequest("max_rank 0 holds no LoRA factors: only collection members "
                                 "(collection_blocks > 0) can use the slots")
        if self.scheduling_policy not in POLICIES:
            raise InvalidRequest(f"scheduling_policy must be one of {POLICIES}",
                                 scheduling_policy=str(self.scheduling_policy))
        if self.async_scheduling not in (None, True, False):
            raise InvalidRequest("async_scheduling must be None, True or False",
                                 async_scheduling=self.async_scheduling)
        if self.max_model_len is not None and (
                not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise InvalidRequest("max_model_len must be an int >= 2",
                                 max_model_len=self.max_model_len)
