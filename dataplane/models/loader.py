"""Build a `LlamaForCausalLM` from a local HF checkpoint (or random weights for benches).

HF tensor names map onto our fused layout: q/k/v rows are stacked into `qkv_proj`,
gate/up into `gate_up_proj`. Every parameter must be filled exactly once with the exact
shape; unknown tensors are rejected (except rotary caches), missing ones are an error.
Tensors are cast to the requested dtype on the way in.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from dataplane.models.config import ModelConfig
from dataplane.models.errors import ModelLoadError
from dataplane.models.llama import LlamaForCausalLM
from dataplane.models.weights import iter_checkpoint

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_FUSED = {
    "self_attn.q_proj": ("qkv_proj", "q_proj"), "self_attn.k_proj": ("qkv_proj", "k_proj"),
    "self_attn.v_proj": ("qkv_proj", "v_proj"), "self_attn.o_proj": ("o_proj", "o_proj"),
    "mlp.gate_proj": ("gate_up_proj", "gate_proj"), "mlp.up_proj": ("gate_up_proj", "up_proj"),
    "mlp.down_proj": ("down_proj", "down_proj"),
}
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


def _target(model: LlamaForCausalLM, name: str) -> tuple[str, torch.Tensor]:
    """(our parameter key, destination view) for an HF tensor name."""
    if name == "model.embed_tokens.weight":
        return "embed_tokens.weight", model.embed_tokens.weight
    if name == "model.norm.weight":
        return "norm.weight", model.norm.weight
    if name == "lm_head.weight" and not model.config.tie_word_embeddings:
        return "lm_head", model.lm_head
    match = _LAYER.match(name)
    if match is not None:
        index, rest = int(match.group(1)), match.group(2)
        if index < len(model.layers):
            layer = model.layers[index]
            if rest in ("input_layernorm.weight", "post_attention_layernorm.weight"):
                norm = getattr(layer, rest.split(".")[0])
                return name, norm.weight
            proj, _, kind = rest.rpartition(".")
            if proj in _FUSED and kind in ("weight", "bias"):
                attr, slice_name = _FUSED[proj]
                linear = getattr(layer, attr)
                param = linear.weight if kind == "weight" else linear.bias
                if param is not None:
                    start, end = linear.slice_rows(slice_name)
                    return name, param[start:end]
    raise ModelLoadError(f"unexpected tensor {name!r} in checkpoint")


def expected_keys(model: LlamaForCausalLM) -> set[str]:
    """HF tensor names the checkpoint must provide."""
    keys = {"model.embed_tokens.weight", "model.norm.weight"}
    if not model.config.tie_word_embeddings:
        keys.add("lm_head.weight")
    for i, layer in enumerate(model.layers):
        keys.add(f"model.layers.{i}.input_layernorm.weight")
        keys.add(f"model.layers.{i}.post_attention_layernorm.weight")
        for proj, (attr, _slice) in _FUSED.items():
            keys.add(f"model.layers.{i}.{proj}.weight")
            if getattr(layer, attr).bias is not None:
                keys.add(f"model.layers.{i}.{proj}.bias")
    return keys


def load_model(model_dir: Path, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """Read config.json + safetensors from `model_dir` into a model on `device` in `dtype`."""
    config = ModelConfig.from_model_dir(model_dir)
    model = LlamaForCausalLM(config, dtype, device)
    loaded: set[str] = set()
    for name, tensor in iter_checkpoint(model_dir):
        if _IGNORED.search(name):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        _key, dest = _target(model, name)
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ModelLoadError(f"tensor {name!r} has shape {list(tensor.shape)}, "
                                 f"expected {list(dest.shape)}")
        if name in loaded:
            raise ModelLoadError(f"tensor {name!r} appears twice")
        with torch.no_grad():
            dest.copy_(tensor.to(dtype))
        loaded.add(name)
    missing = expected_keys(model) - loaded
    if missing:
        raise ModelLoadError(f"checkpoint misses {len(missing)} tensors",
                             missing=sorted(missing)[:10])
    return model.eval()


def init_random(model: LlamaForCausalLM, seed: int, std: float = 0.02) -> LlamaForCausalLM:
    """Fill every weight with N(0, std) (norms with 1) from a seeded generator, on device.

    For benchmarks with a model shape but no checkpoint (e.g. Llama-3-8B-shaped bf16).
    """
    device = model.embed_tokens.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, std, generator=gen)
    return model.eval()
