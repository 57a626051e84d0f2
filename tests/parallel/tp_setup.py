"""What the TP scenarios share: a tiny random Llama, two adapters (global PEFT factors),
the requests, and a rank's engine over its shard.

The model has four heads and two kv heads: at TP=4 each kv head is replicated on two
ranks. Adapter 0 (rank 8) targets every projection, adapter 1 (rank 4) only q/k/v/o.
"""

from __future__ import annotations

import torch

from dataplane.core import Sequence
from dataplane.engine import Engine, EngineConfig
from dataplane.engine.adapters import LoadedAdapter, ModuleFactors
from dataplane.models import ModelConfig, init_random
from dataplane.models.llama import LlamaForCausalLM
from dataplane.parallel import TPGroup
from dataplane.parallel.shard_model import shard_adapter, shard_model

BLOCK = 4
MAX_RANK = 8
H_BASE = "b" * 64
CONFIG = {"model_type": "llama", "vocab_size": 96, "hidden_size": 32,
          "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1,
          "eos_token_id": 2}
# (prompt, adapter index): -1 = base; adapter 1 skips the MLP
REQUESTS = [([5, 17, 33, 8, 61], -1), ([5, 17, 33, 8, 61], 0), ([70, 3, 44], 1),
            ([9, 9, 12, 80, 2, 40, 7], 0), ([70, 3, 44], -1)]
NEW_TOKENS = 6


def global_model() -> LlamaForCausalLM:
    config = ModelConfig.from_dict(dict(CONFIG))
    return init_random(LlamaForCausalLM(config, torch.float32, torch.device("cpu")), seed=5)


def global_adapters(config: ModelConfig) -> list[LoadedAdapter]:
    gen = torch.Generator().manual_seed(11)
    shapes = config.module_shapes
    out = []
    for index, (rank, modules) in enumerate(((8, tuple(shapes)),
                                             (4, ("q_proj", "k_proj", "v_proj", "o_proj")))):
        factors = []
        for layer in range(config.num_layers):
            for module in modules:
                d_out, d_in = shapes[module]
                factors.append(ModuleFactors(layer, module,
                                             0.3 * torch.randn(rank, d_in, generator=gen),
                                             0.3 * torch.randn(d_out, rank, generator=gen),
                                             2.0 / rank))
        out.append(LoadedAdapter(tuple(factors), f"{index + 1:x}" * 64, f"adapter-{index}"))
    return out


def engine_config(**changes: object) -> EngineConfig:
    sizes: dict[str, object] = {
        "max_slots": 2, "max_rank": MAX_RANK, "num_kv_blocks": 256, "block_size": BLOCK,
        "max_num_seqs": 8, "max_num_batched_tokens": 64, "enable_cuda_graphs": False,
        "enable_prefix_caching": False, "sampler_seed": 0, **changes}
    return EngineConfig(**sizes)  # type: ignore[arg-type]


def rank_engine(group: TPGroup | None, **changes: object) -> Engine:
    """The whole model on one device (`group` None) or this rank's shard of it."""
    model = global_model()
    if group is not None:
        model = shard_model(model, group)
    attention = "triton" if model.embed_tokens.weight.device.type == "cuda" else "torch"
    return Engine(model, engine_config(attention_backend=attention, **changes), H_BASE)


def load_shards_directly(engine: Engine, group: TPGroup) -> None:
    """Every rank puts its shard of both adapters into its own pool, in the same order
    (the pools decide alike): for scenarios that drive the runners themselves, with no
    leader. Slots 0 and 1."""
    for adapter in global_adapters(engine.model.global_config):
        mine = shard_adapter(adapter, engine.model.global_config, group.rank, group.size)
        engine.pool.load(adapter.digest, mine)


def sequences(engine: Engine, blocks: int = 8) -> list[Sequence]:
    """The requests, `blocks` KV blocks each drawn from the engine's pool (pages no
    adapter holds); adapter i is slot i."""
    seqs = []
    for i, (prompt, slot) in enumerate(REQUESTS):
        digest = None if slot < 0 else engine.adapters.bound()[slot].digest
        seq = Sequence(f"r{i}", tuple(prompt), adapter_slot=slot, adapter_digest=digest)
        seq.block_table.extend(engine.pool.pool.allocate_kv(f"r{i}", blocks))
        seqs.append(seq)
    return seqs


def close_channel(engine: Engine) -> None:
    """Every rank, at the end of a scenario that drove its runner itself (no leader, no
    `serve()`): tear the control channel's gloo subgroup down together, before the group
    (a subgroup left to process exit can abort it)."""
    if engine.lockstep is not None:
        engine.lockstep.channel.close()
