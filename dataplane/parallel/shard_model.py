"""One tensor-parallel rank's shard of a Llama-family model and of its adapters.

A rank runs the ordinary `LlamaForCausalLM` at its *local* sizes (`local_config`: heads,
kv heads and MLP width divided by the TP degree), so the decoder layer, attention, the
paged KV cache, the unified pool and the LoRA kernels are the one-GPU ones. What differs
is where each weight comes from and three collectives (Megatron):

    qkv_proj, gate_up_proj  column shards: this rank's rows of every fused slice (whole
                            heads; kv heads replicated when the ranks outnumber them)
    o_proj, down_proj       row shards: this rank's input columns; `LoRALinear.reduce`
                            all-reduces the partial output (one base call each)
    embed_tokens            vocab-parallel, one all-reduce
    logits_head             vocab-parallel LM head, one all-gather

so a step issues ``2 * num_layers + 2`` base collectives, and the LoRA adds none: a rank
holds, of every adapted module (PEFT orientation, A ``[r, d_in]``, B ``[d_out, r]``),

    column  A whole            B rows like the base slice's
    row     A input columns    B whole

`shard_adapter` turns an adapter's global factors into that shard, an adapter of the local
model's shapes: the rank's pool stores it like any other (docs/ARCHITECTURE.md, "Tensor
parallelism"). The replicated factor costs ``(N-1)/N`` of it in bytes per rank; sharding it
too would add a collective per projection, which costs more than it saves at serving
sizes (docs/PERFORMANCE.md, "Tensor parallel").
"""

from __future__ import annotations

import dataclasses
from typing import cast

import torch

from dataplane.engine.adapters import LoadedAdapter, ModuleFactors
from dataplane.identity import KernelLocalIdentity, ModuleSpec
from dataplane.layers.lora_linear import LoRALinear
from dataplane.models.config import ModelConfig
from dataplane.models.llama import LORA_GROUPS, DecoderLayer, LlamaForCausalLM
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.errors import IndivisibleShardError, ShardShapeError
from dataplane.parallel.layout_identity import CONVERSION_REVISION, tp_kernel_local_identity
from dataplane.parallel.shard import (
    COLUMN,
    ROW,
    replicates,
    shard_column_weight,
    shard_lora_factors,
    shard_row_weight,
)
from dataplane.parallel.vocab import ParallelLMHead, VocabParallelEmbedding

COLUMN_GROUPS = ("qkv_proj", "gate_up_proj")
STYLE_OF = {name: COLUMN if attr in COLUMN_GROUPS else ROW
            for attr, names in LORA_GROUPS.items() for name in names}
"""PEFT module name -> its projection's parallel style."""
KV_MODULES = ("k_proj", "v_proj")


def local_config(config: ModelConfig, tp_size: int) -> ModelConfig:
    """The per-rank config: heads, kv heads and MLP width divided by `tp_size`. With fewer
    kv heads than ranks (``tp_size`` a multiple of them) each rank holds one kv head, shared
    by ``tp_size / num_kv_heads`` ranks (`replicates`): its q heads all map to it."""
    kv_shared = replicates(config.num_kv_heads, tp_size, 1)
    for name, value in (("num_heads", config.num_heads), ("num_kv_heads", config.num_kv_heads),
                        ("intermediate_size", config.intermediate_size)):
        if value % tp_size and not (name == "num_kv_heads" and kv_shared):
            raise IndivisibleShardError(f"{name}={value} does not split over {tp_size} ranks")
    return dataclasses.replace(config, num_heads=config.num_heads // tp_size,
                               num_kv_heads=max(1, config.num_kv_heads // tp_size),
                               intermediate_size=config.intermediate_size // tp_size)


def _column_units(gc: ModelConfig, attr: str) -> tuple[tuple[int, ...], tuple[int, ...],
                                                         tuple[bool, ...]]:
    """(global slice widths, shard units, replicated-units flags) of a column group."""
    if attr == "qkv_proj":
        return ((gc.q_size, gc.kv_size, gc.kv_size), (gc.head_dim,) * 3, (False, True, True))
    return (gc.intermediate_size,) * 2, (1, 1), (False, False)


def shard_model(global_model: LlamaForCausalLM, group: TPGroup) -> LlamaForCausalLM:
    """This rank's shard of `global_model` (loaded on any device) on `group.device`."""
    gc, dt, dev = global_model.config, global_model.dtype, group.device
    model = LlamaForCausalLM(local_config(gc, group.size), dt, dev)
    model.tp_group, model.global_config = group, gc
    embed = VocabParallelEmbedding(group, gc.vocab_size, gc.hidden_size, dt)
    embed.load_global_weight(global_model.embed_tokens.weight)
    model.embed_tokens = embed  # type: ignore[assignment]  # same call contract, a .weight
    head = ParallelLMHead(group, gc.vocab_size, gc.hidden_size, dt)
    head.load_global_weight(global_model.lm_head_weight)
    model.logits_head = head
    model.add_module("parallel_lm_head", head)
    if not gc.tie_word_embeddings:
        del model.lm_head
    model.lm_head_weight = head.weight
    model.norm.load_state_dict(global_model.norm.state_dict())
    for mine, theirs in zip(model.layers, global_model.layers, strict=True):
        layer, g = cast(DecoderLayer, mine), cast(DecoderLayer, theirs)
        layer.input_layernorm.load_state_dict(g.input_layernorm.state_dict())
        layer.post_attention_layernorm.load_state_dict(g.post_attention_layernorm.state_dict())
        for attr in LORA_GROUPS:
            src, dst = getattr(g, attr), cast(LoRALinear, getattr(layer, attr))
            weight, bias = src.weight.detach().to(dev), src.bias
            if attr in COLUMN_GROUPS:
                widths, units, rep = _column_units(gc, attr)
                local_w = shard_column_weight(weight, widths, group.rank, group.size, units,
                                              rep)
                local_b = (None if bias is None else shard_column_weight(
                    bias.detach().to(dev), widths, group.rank, group.size, units, rep))
            else:
                local_w = shard_row_weight(weight, group.rank, group.size)
                local_b = None if bias is None else bias.detach().to(dev)
                dst.reduce = group
            if tuple(local_w.shape) != tuple(dst.weight.shape):
                raise ShardShapeError(f"{attr}: local weight {list(local_w.shape)} != "
                                      f"{list(dst.weight.shape)}")
            with torch.no_grad():
                dst.weight.copy_(local_w)
                if local_b is not None and dst.bias is not None:
                    dst.bias.copy_(local_b)
    model.eval()
    return model


def shard_adapter(adapter: LoadedAdapter, global_config: ModelConfig, tp_rank: int,
                  tp_size: int) -> LoadedAdapter:
    """The rank's shard of `adapter` (global PEFT factors): an adapter of the local model's
    shapes with the same digest and source (module docstring for what each rank holds).
    Its specs are left out: a shard's H_kernel_local is `rank_kernel_local`'s."""
    gc = global_config
    modules = []
    for m in adapter.modules:
        if m.module not in STYLE_OF:
            raise ShardShapeError(f"layer {m.layer}: {m.module!r} is not a LoRA projection")
        local = shard_lora_factors(
            m.a, m.b, m.scale, style=STYLE_OF[m.module], tp_rank=tp_rank, tp_size=tp_size,
            out_unit=gc.head_dim if m.module in ("q_proj", *KV_MODULES) else 1,
            out_replicate=m.module in KV_MODULES)
        modules.append(ModuleFactors(m.layer, m.module, local.a, local.b, m.scale))
    return LoadedAdapter(tuple(modules), adapter.digest, adapter.source)


def rank_kernel_local(specs: tuple[ModuleSpec, ...], adapter_semantic: str,
                      global_config: ModelConfig, kernel_family: str, dtype: str,
                      tp_rank: int, tp_size: int) -> KernelLocalIdentity:
    """H_kernel_local of one rank's shard of an adapter of `specs`: each module's style and
    this rank's shard ranges of A or B (q/k/v B in whole heads; k/v heads replicated where
    the ranks outnumber them), the TP shard, the paged packing of the rank's pool."""
    heads = {"q_proj": global_config.head_dim, "k_proj": global_config.head_dim,
             "v_proj": global_config.head_dim}
    return tp_kernel_local_identity(
        adapter_semantic=adapter_semantic, kernel_family=kernel_family,
        conversion_revision=CONVERSION_REVISION, dtype=dtype, packing="paged", specs=specs,
        styles={s.name: STYLE_OF[s.role] for s in specs if s.role in STYLE_OF},
        tp_rank=tp_rank, tp_size=tp_size,
        out_units={s.name: heads[s.role] for s in specs if s.role in heads},
        replicated={s.name for s in specs if s.role in KV_MODULES})
