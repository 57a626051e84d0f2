"""A Llama-family decoder sharded over a TP group, re-using dataplane.models unchanged.

`TPLlamaForCausalLM(global_model, group)` is a `LlamaForCausalLM` whose config is the
*per-rank* config (``num_heads/N``, ``num_kv_heads/N`` or one replicated kv head,
``intermediate_size/N``), so the model engineer's `DecoderLayer.forward`, attention and
paged KV cache run unchanged on this rank's heads; its projections are swapped for the
parallel ones:

    qkv_proj, gate_up_proj  ColumnParallelLinear   (no collective)
    o_proj, down_proj       RowParallelLinear      (one base all-reduce each)
    embed_tokens            VocabParallelEmbedding (one base all-reduce)
    compute_logits          ParallelLMHead         (one base all-gather)

Per decode/prefill step the base path issues ``2 * num_layers + 2`` collectives; the LoRA
branch adds none in the default layout and one per paper-layout projection.
The engine's `ModelRunner` drives it as it drives a single-GPU model (KV cache sized by
the local config). Adapters are loaded with `load_adapter(slot, factors)` from *global*
PEFT factors; each module shards them into its own tables (`owns_lora_tables = True`,
so the runner allocates none for these projections).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, cast

import torch

from dataplane.identity import KernelLocalIdentity, ModuleSpec
from dataplane.layers.lora_fold_slots import FoldSlots
from dataplane.models.config import ModelConfig
from dataplane.models.llama import (
    GATE_UP_SLICES,
    LORA_GROUPS,
    QKV_SLICES,
    DecoderLayer,
    LlamaForCausalLM,
)
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.cost_model import LayoutDecision, ModuleTraffic, decide_layout
from dataplane.parallel.errors import IndivisibleShardError, ShardShapeError
from dataplane.parallel.layout_identity import CONVERSION_REVISION, tp_kernel_local_identity
from dataplane.parallel.linear import ColumnParallelLinear, RowParallelLinear
from dataplane.parallel.lora_tp import GlobalSliceFactors
from dataplane.parallel.shard import COLUMN, LAYOUT_LOCAL, ROW, replicates
from dataplane.parallel.vocab import ParallelLMHead, VocabParallelEmbedding


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


COLUMN_GROUPS = ("qkv_proj", "gate_up_proj")


class PeftModuleFactors(Protocol):
    """One adapted PEFT module (e.g. dataplane.engine.adapters.ModuleFactors)."""

    @property
    def layer(self) -> int: ...
    @property
    def module(self) -> str: ...
    @property
    def a(self) -> torch.Tensor: ...
    @property
    def b(self) -> torch.Tensor: ...
    @property
    def scale(self) -> float: ...


def group_peft_modules(modules: Iterable[PeftModuleFactors]
                       ) -> dict[tuple[int, str], GlobalSliceFactors]:
    """Per-PEFT-module factors -> `load_adapter`'s ``{(layer, fused attr): {slice: ...}}``.

    ``q_proj`` becomes slice 0 of ``qkv_proj``, ``up_proj`` slice 1 of ``gate_up_proj``...
    (dataplane.models.llama.LORA_GROUPS). Unknown module names raise.
    """
    slot_of = {name: (attr, k) for attr, names in LORA_GROUPS.items()
               for k, name in enumerate(names)}
    out: dict[tuple[int, str], dict[int, tuple[torch.Tensor, torch.Tensor, float]]] = {}
    for m in modules:
        if m.module not in slot_of:
            raise ShardShapeError(f"layer {m.layer}: {m.module!r} is not a LoRA projection")
        attr, k = slot_of[m.module]
        out.setdefault((m.layer, attr), {})[k] = (m.a, m.b, float(m.scale))
    return dict(out)


def auto_lora_layouts(config: ModelConfig, tp_size: int, *, rank: int, tokens: int,
                      active_adapters: int, resident_adapters: int, dtype_bytes: int = 2,
                      extra_resident_budget_bytes: int | None = None
                      ) -> dict[str, LayoutDecision]:
    """Cost-model decision (cost_model.decide_layout) for each fused projection."""
    c = config
    shapes = {"qkv_proj": (c.hidden_size, c.q_size + 2 * c.kv_size, 3),
              "o_proj": (c.q_size, c.hidden_size, 1),
              "gate_up_proj": (c.hidden_size, 2 * c.intermediate_size, 2),
              "down_proj": (c.intermediate_size, c.hidden_size, 1)}
    out = {}
    for attr, (d_in, d_out, slices) in shapes.items():
        traffic = ModuleTraffic(style=COLUMN if attr in COLUMN_GROUPS else ROW, d_in=d_in,
                                d_out=d_out, num_slices=slices, rank=rank, tp_size=tp_size,
                                tokens=tokens, active_adapters=active_adapters,
                                resident_adapters=resident_adapters, dtype_bytes=dtype_bytes)
        out[attr] = decide_layout(traffic,
                                  extra_resident_budget_bytes=extra_resident_budget_bytes)
    return out


def layout_choices(specs: Iterable[ModuleSpec], lora_layouts: Mapping[str, str]
                   ) -> dict[str, tuple[str, str]]:
    """(style, layout) of every adapted module, for `tp_kernel_local_identity` and
    `tp_contract_digest`: a spec's role (q_proj, ...) names its fused projection."""
    group_of = {name: attr for attr, names in LORA_GROUPS.items() for name in names}
    out = {}
    for spec in specs:
        if spec.role not in group_of:
            raise ShardShapeError(f"{spec.name}: role {spec.role!r} is not a LoRA projection")
        attr = group_of[spec.role]
        style = COLUMN if attr in COLUMN_GROUPS else ROW
        out[spec.name] = (style, lora_layouts.get(attr, LAYOUT_LOCAL))
    return out


class TPLlamaForCausalLM(LlamaForCausalLM):
    """This rank's shard of `global_model` (a loaded single-device model, any device).

    Args:
        lora_layouts: fused attribute ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
            -> LoRA layout (e.g. from `auto_lora_layouts`); missing attributes use
            no_extra_collectives.
        max_slots / max_rank: LoRA slot tables per projection (0 slots = base only).
    """

    def __init__(self, global_model: LlamaForCausalLM, group: TPGroup, *,
                 lora_layouts: Mapping[str, str] | None = None, max_slots: int = 0,
                 max_rank: int = 16, bottleneck_dtype: torch.dtype = torch.float32) -> None:
        gc = global_model.config
        super().__init__(local_config(gc, group.size), global_model.dtype, group.device)
        self.group, self.global_config = group, gc
        self.max_slots = max_slots
        dt, dev = global_model.dtype, group.device
        layouts = dict(lora_layouts or {})
        self.lora_layouts = {attr: layouts.get(attr, LAYOUT_LOCAL) for attr in LORA_GROUPS}
        hd = gc.head_dim
        embed = VocabParallelEmbedding(group, gc.vocab_size, gc.hidden_size, dt)
        embed.load_global_weight(global_model.embed_tokens.weight)
        # same call contract (ids -> hidden) and a `.weight` on this rank's device
        self.embed_tokens = embed  # type: ignore[assignment]
        self.parallel_lm_head = ParallelLMHead(group, gc.vocab_size, gc.hidden_size, dt)
        self.parallel_lm_head.load_global_weight(global_model.lm_head_weight)
        if not gc.tie_word_embeddings:
            del self.lm_head
        self.lm_head_weight = self.parallel_lm_head.weight
        self.norm.load_state_dict(global_model.norm.state_dict())
        for layer_module, g_module in zip(self.layers, global_model.layers, strict=True):
            layer, g = cast(DecoderLayer, layer_module), cast(DecoderLayer, g_module)
            layer.input_layernorm.load_state_dict(g.input_layernorm.state_dict())
            layer.post_attention_layernorm.load_state_dict(
                g.post_attention_layernorm.state_dict())
            qkv = ColumnParallelLinear(group, gc.hidden_size, (gc.q_size, gc.kv_size,
                                                               gc.kv_size),
                                       QKV_SLICES, bias=gc.qkv_bias, dtype=dt, units=(hd,) * 3,
                                       replicate=(False, True, True))
            o = RowParallelLinear(group, gc.q_size, gc.hidden_size, "o_proj",
                                  bias=gc.o_bias, dtype=dt)
            gate_up = ColumnParallelLinear(group, gc.hidden_size,
                                           (gc.intermediate_size, gc.intermediate_size),
                                           GATE_UP_SLICES, bias=gc.mlp_bias, dtype=dt)
            down = RowParallelLinear(group, gc.intermediate_size, gc.hidden_size, "down_proj",
                                     bias=gc.mlp_bias, dtype=dt)
            for attr, mod in (("qkv_proj", qkv), ("o_proj", o), ("gate_up_proj", gate_up),
                              ("down_proj", down)):
                src = getattr(g, attr)
                mod.load_global_weight(src.weight.to(dev), None if src.bias is None
                                       else src.bias.to(dev))
                if max_slots > 0:
                    mod.enable_lora(layouts.get(attr, LAYOUT_LOCAL), num_slots=max_slots,
                                    max_rank=max_rank, bottleneck_dtype=bottleneck_dtype)
                setattr(layer, attr, mod)
        self.eval()

    def enable_lora_fold(self, max_rows: int, width_unit: int | None = None) -> int:
        """Fold the LoRA into the base GEMMs and their consumer ops for steps of at most
        `max_rows` rows (decode steps: dataplane/layers/lora_fold_store.py), in each
        projection of the default layout (paper-layout ones keep their launches). The folds
        hold ``min(max_slots, max_rows)`` adapters, filled on demand (`FoldSlots`, fold
        widths in multiples of `width_unit`). Returns how many projections fold."""
        if self.max_slots <= 0 or max_rows <= 0:
            raise ShardShapeError("a LoRA fold needs LoRA slots and a row limit")
        slots = FoldSlots(self.max_slots, min(self.max_slots, max_rows), width_unit=width_unit)
        folded = 0
        for layer in range(len(self.layers)):
            for attr in LORA_GROUPS:
                if self.lora_layouts[attr] == LAYOUT_LOCAL:
                    mod = self.parallel_linear(layer, attr)
                    assert mod.branch is not None
                    slots.attach(mod.branch.table, mod.enable_fold(slots.fold_slots))
                    folded += 1
        self.lora_fold_rows = max_rows if folded else 0
        self.lora_fold_slots = slots if folded else None
        return folded

    def kernel_local_identity(self, adapter_semantic: str, specs: Sequence[ModuleSpec],
                              kernel_family: str) -> KernelLocalIdentity:
        """This rank's H_kernel_local inputs for an adapter of `specs`: each module's
        (style, layout) and this rank's shard ranges of its A and B (q/k/v B in whole
        heads; k/v heads replicated where the ranks outnumber them), the TP shard."""
        gc, size = self.global_config, self.group.size
        heads = {"q_proj": gc.head_dim, "k_proj": gc.head_dim, "v_proj": gc.head_dim}
        fold = "+fold" if self.lora_fold_slots is not None else ""
        return tp_kernel_local_identity(
            adapter_semantic=adapter_semantic, kernel_family=kernel_family + fold,
            conversion_revision=CONVERSION_REVISION, dtype=str(self.dtype).split(".")[-1],
            packing="stacked", specs=specs, choices=layout_choices(specs, self.lora_layouts),
            tp_rank=self.group.rank, tp_size=size,
            out_units={s.name: heads[s.role] for s in specs if s.role in heads},
            replicated={s.name for s in specs if s.role in ("k_proj", "v_proj")})

    def parallel_linear(self, layer: int, attr: str) -> ColumnParallelLinear | RowParallelLinear:
        if attr not in LORA_GROUPS:
            raise ShardShapeError(f"unknown projection {attr!r}")
        mod = getattr(self.layers[layer], attr)
        if not isinstance(mod, (ColumnParallelLinear, RowParallelLinear)):
            raise ShardShapeError(f"layer {layer} {attr} is not a parallel projection")
        return mod

    def load_adapter(self, slot: int, factors: Mapping[tuple[int, str], GlobalSliceFactors]
                     ) -> None:
        """Shard and load one adapter: ``factors[(layer, attr)][slice] = (A, B, scale)``,
        global PEFT orientation (the same dict a single-device `LoraFactorTable` takes).
        Projections absent from `factors` get rank 0 in `slot`."""
        mods = {key: self.parallel_linear(*key) for key in factors}
        for layer in range(len(self.layers)):
            for attr in LORA_GROUPS:
                mod = self.parallel_linear(layer, attr)
                if mod.branch is not None and (layer, attr) not in mods:
                    mod.branch.clear_slot(slot)
        for key, mod in mods.items():
            mod.load_adapter(slot, factors[key])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab], gathered on every rank."""
        return self.parallel_lm_head(self.norm(hidden))
