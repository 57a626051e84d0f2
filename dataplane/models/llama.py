"""Llama-family decoder (Llama, Mistral, Qwen2) over packed rows with paged KV and LoRA.

The forward consumes one step's packed rows (`input_ids [T]`), the step's attention
metadata and LoRA context (built once per step by the model runner, shared by all layers)
and the paged KV cache. q/k/v and gate/up are fused `LoRALinear`s with one slice per
projection, so one base GEMM and one LoRA call serve each fused group.
Numerics follow HF modeling_llama: residual stream and projections in the model dtype,
RMSNorm statistics and RoPE angles in fp32, logits returned in fp32.

Layers pass (hidden, residual) along as vLLM does, so the elementwise work between GEMMs
is one fused op each (dataplane.ops): residual-add + RMSNorm, RoPE + KV cache write,
SiLU * up. `ops_backend` ("auto": Triton on CUDA tensors, torch otherwise) picks the path.
On steps whose LoRA context says `fold`, a projection that holds a LoRA fold returns its
bottleneck columns with `y` (`project`), and the op that consumes `y` adds each row's
expand (dataplane/ops/lora_fold.py); a down projection's fold waits in `lora.pending` for
the next layer's add-norm.

A tensor-parallel rank runs this same class at its local sizes (`tp_group` set,
dataplane/parallel/shard_model.py): vocab-parallel embeddings, row-parallel o/down shards
that all-reduce, and an LM head that gathers the vocabulary (`logits_head`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from dataplane.parallel.collectives import TPGroup

from dataplane.attention.kv_cache import PagedKVCache
from dataplane.attention.metadata import AttentionMetadata
from dataplane.attention.paged_attention import paged_attention
from dataplane.layers.lora_fold_slots import FoldSlots
from dataplane.layers.lora_linear import LoRALinear, LoraStepContext
from dataplane.layers.norm import RMSNorm
from dataplane.layers.rotary import RotaryEmbedding
from dataplane.models.config import ModelConfig
from dataplane.ops import check_ops_backend, fused_add_rms_norm, rope_and_cache
from dataplane.ops.lora_fold import FoldedExpand

QKV_SLICES = ("q_proj", "k_proj", "v_proj")
GATE_UP_SLICES = ("gate_proj", "up_proj")
LORA_GROUPS = {"qkv_proj": QKV_SLICES, "o_proj": ("o_proj",),
               "gate_up_proj": GATE_UP_SLICES, "down_proj": ("down_proj",)}
"""Fused LoRALinear attribute -> PEFT module names of its slices (output order)."""

Folded = tuple[torch.Tensor, FoldedExpand]


def project(proj: nn.Module, x: torch.Tensor, lora: LoraStepContext | None
            ) -> tuple[torch.Tensor, Folded | None]:
    """``proj(x, lora)``, or for a projection with a hot-slot fold on a folding step its
    ``forward_fold``: (y, (z tail, expand)) for the consumer op to finish the LoRA."""
    fold_fn = getattr(proj, "forward_fold", None)
    if lora is not None and lora.fold and fold_fn is not None:
        out: tuple[torch.Tensor, Folded | None] = fold_fn(x, lora)
        return out
    return proj(x, lora), None


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int, dtype: torch.dtype,
                 device: torch.device | None) -> None:
        super().__init__()
        c = config
        self.index = index
        self.window = c.layer_windows[index]
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.scale = c.head_dim ** -0.5
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.qkv_proj = LoRALinear(c.hidden_size, QKV_SLICES, (c.q_size, c.kv_size, c.kv_size),
                                   c.qkv_bias, dtype, device)
        self.o_proj = LoRALinear(c.q_size, ("o_proj",), (c.hidden_size,), c.o_bias, dtype, device)
        self.gate_up_proj = LoRALinear(c.hidden_size, GATE_UP_SLICES,
                                       (c.intermediate_size, c.intermediate_size), c.mlp_bias,
                                       dtype, device)
        self.down_proj = LoRALinear(c.intermediate_size, ("down_proj",), (c.hidden_size,),
                                    c.mlp_bias, dtype, device)
        self.ops_backend = "auto"

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None,
                cos_sin: tuple[torch.Tensor, torch.Tensor], attn: AttentionMetadata,
                cache: PagedKVCache, lora: LoraStepContext | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) -> (this layer's MLP output, residual stream before adding it).

        The first layer gets residual None (h = the embeddings). The hidden state after
        the layer is `h' + residual'`; the next layer's fused add-norm forms it. Buffers
        of `h` and `residual` may be reused in place: callers use the returned tensors.
        """
        q, k, v, residual = self.pre_attention(h, residual, cos_sin, attn.slot_mapping, cache,
                                               lora)
        o = paged_attention(q, k, v, self.index, cache, attn, self.window, self.scale,
                            write_kv=False)
        return self.post_attention(o, residual, lora)

    def pre_attention(self, h: torch.Tensor, residual: torch.Tensor | None,
                      cos_sin: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor,
                      cache: PagedKVCache, lora: LoraStepContext | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer up to attention: add-norm, q/k/v (+ LoRA), RoPE and this step's KV
        write at `slot_mapping`. Returns (q, k, v, residual); q and k rotated."""
        t = h.shape[0]
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            pending = lora.take_pending() if lora is not None else None
            x, residual = self.input_layernorm.forward_add(h, residual, pending)
        qkv, folded = project(self.qkv_proj, x, lora)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[:, :q_size].view(t, self.num_heads, self.head_dim)
        k = qkv[:, q_size:q_size + kv_size].view(t, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_size + kv_size:q_size + 2 * kv_size].view(t, self.num_kv_heads,
                                                               self.head_dim)
        cos, sin = cos_sin
        q, k = rope_and_cache(q, k, v, cos, sin, cache.k[self.index], cache.v[self.index],
                              slot_mapping, self.ops_backend,
                              fold=folded[1] if folded else None,
                              tail=folded[0] if folded else None)
        return q, k, v, residual

    def post_attention(self, o: torch.Tensor, residual: torch.Tensor,
                       lora: LoraStepContext | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer after attention (`o` [T, Hq, D]): o (+ LoRA), add-norm, gate/up
        (+ LoRA) with SiLU·mul, down (+ LoRA). Returns (MLP output, residual)."""
        t = o.shape[0]
        y, folded = project(self.o_proj, o.reshape(t, self.num_heads * self.head_dim), lora)
        x, residual = self.post_attention_layernorm.forward_add(y, residual, folded)
        act = self.gate_up_proj.forward_silu_mul(x, lora, self.ops_backend)
        out, folded = project(self.down_proj, act, lora)
        if folded is not None and lora is not None:  # the next add-norm finishes it
            lora.pending.append(folded)
        return out, residual


class LlamaForCausalLM(nn.Module):
    """Embeddings, decoder layers, final norm and LM head (tied to embeddings when the config
    says so). Parameters are allocated empty; fill them with `models.loader.load_weights`
    or `init_random`."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self.config, self.dtype = config, dtype
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, dtype=dtype, device=device)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(c, i, dtype, device)
                                    for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.rotary = RotaryEmbedding(c.rope, c.head_dim, device)
        self.lm_head_weight: torch.Tensor
        if c.tie_word_embeddings:
            self.lm_head_weight = self.embed_tokens.weight
        else:
            self.lm_head = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size, dtype=dtype,
                                                    device=device), requires_grad=False)
            self.lm_head_weight = self.lm_head
        self.ops_backend = "auto"
        self.tp_group: TPGroup | None = None
        """This rank's tensor-parallel group (None: the whole model on one device)."""
        self.global_config = config
        """The whole model's config (`config` is this rank's local one under TP)."""
        self.logits_head: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Normalised hidden rows -> float32 logits over the whole vocabulary, when not
        ``hidden @ lm_head_weight^T`` (a TP rank's vocab-parallel head)."""

    lora_fold_rows = 0
    """Steps of at most this many rows fold the LoRA into the base GEMMs and their
    consumer ops (`project`); 0 = never (the runner's `enable_lora_fold` sets it)."""
    lora_fold_slots: FoldSlots | None = None
    """Which adapters the folds hold (set with `lora_fold_rows`): the runner asks it for
    each folded step's rows' fold slots."""

    def set_ops_backend(self, name: str) -> None:
        """Fused elementwise ops path for every layer: "auto" | "torch" | "triton"."""
        self.ops_backend = check_ops_backend(name)
        for module in self.modules():
            if hasattr(module, "ops_backend"):
                setattr(module, "ops_backend", name)  # noqa: B010 - nn.Module typing

    def forward(self, input_ids: torch.Tensor, attn: AttentionMetadata, cache: PagedKVCache,
                lora: LoraStepContext | None) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, hidden] (before the final norm)."""
        h = self.embed_tokens(input_ids)
        cos_sin = self.rotary.cos_sin(attn.positions, self.dtype)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            h, residual = layer(h, residual, cos_sin, attn, cache, lora)
        pending = lora.take_pending() if lora is not None else None
        if pending is not None and residual is not None:
            # the last layer's folded down projection: its expand, added by the add-norm
            # kernel (one launch); the normalised rows are not used
            _, summed = fused_add_rms_norm(h, residual, self.norm.weight, self.norm.eps,
                                           self.ops_backend, fold=pending[1], tail=pending[0])
            return summed
        return h if residual is None else h + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] (rows to sample) -> logits [N, vocab] float32."""
        if self.logits_head is not None:
            return self.logits_head(self.norm(hidden))
        return F.linear(self.norm(hidden), self.lm_head_weight).float()

    def lora_linears(self) -> list[tuple[int, str, LoRALinear]]:
        """(layer index, fused attribute name, module) of every LoRA-capable projection."""
        out = []
        for i, layer in enumerate(self.layers):
            for attr in LORA_GROUPS:
                out.append((i, attr, getattr(layer, attr)))
        return out
