"""Llama-family model configuration parsed from an HF `config.json` (no transformers import).

Covers Llama, Mistral and Qwen2: GQA, RMSNorm, SiLU-gated MLP, RoPE with the scaling
variants `default`, `linear`, `llama3` and `yarn`, tied embeddings, Qwen2's q/k/v bias,
Llama's optional `attention_bias` / `mlp_bias`, and sliding windows (Mistral: every layer;
Qwen2: layers at or above `max_window_layers` when `use_sliding_window`).

Both HF config dialects are accepted: transformers < 5 (`rope_theta` + `rope_scaling`)
and transformers >= 5 (`rope_parameters`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from dataplane.models.errors import ModelLoadError, UnsupportedModel

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    """RoPE parameters in HF's `rope_parameters` vocabulary (see layers/rotary.py)."""

    rope_type: str
    theta: float
    factor: float = 1.0
    partial_rotary_factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    """Shape and options of one Llama-family decoder. Frozen; derived sizes are cached."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    layer_windows: tuple[int | None, ...]
    """Per layer: sliding-window size in tokens (key kept iff q_pos - k_pos < window), or None."""
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @cached_property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @cached_property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @cached_property
    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(d_out, d_in) of each LoRA-targetable projection, by PEFT module name."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (self.q_size, h),
            "k_proj": (self.kv_size, h),
            "v_proj": (self.kv_size, h),
            "o_proj": (h, self.q_size),
            "gate_proj": (i, h),
            "up_proj": (i, h),
            "down_proj": (h, i),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse an HF config dict; raises UnsupportedModel / ModelLoadError on bad input."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(f"model_type {model_type!r} is not supported",
                                   supported=list(SUPPORTED_MODEL_TYPES))
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModel(f"hidden_act {act!r} is not supported (silu only)")
        try:
            hidden = _pos_int(raw, "hidden_size")
            heads = _pos_int(raw, "num_attention_heads")
            kv_heads = int(raw.get("num_key_value_heads") or heads)
            head_dim = int(raw.get("head_dim") or hidden // heads)
            layers = _pos_int(raw, "num_hidden_layers")
            vocab = _pos_int(raw, "vocab_size")
            inter = _pos_int(raw, "intermediate_size")
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"invalid config.json: {exc}") from exc
        if kv_heads <= 0 or heads % kv_heads != 0:
            raise ModelLoadError("num_attention_heads must be a multiple of num_key_value_heads",
                                 heads=heads, kv_heads=kv_heads)
        max_pos = int(raw.get("max_position_embeddings", 2048))
        rope = _parse_rope(raw, max_pos)
        if model_type == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        else:
            attn_bias = bool(raw.get("attention_bias", False))
            qkv_bias, o_bias, mlp_bias = attn_bias, attn_bias, bool(raw.get("mlp_bias", False))
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            model_type=model_type, vocab_size=vocab, hidden_size=hidden,
            intermediate_size=inter, num_layers=layers, num_heads=heads,
            num_kv_heads=kv_heads, head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_pos, rope=rope,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias,
            layer_windows=_layer_windows(raw, model_type, layers),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            bos_token_id=raw.get("bos_token_id"),
        )

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path} is not a JSON object")
        return cls.from_dict(raw)


def _pos_int(raw: dict[str, Any], key: str) -> int:
    value = int(raw[key])
    if value <= 0:
        raise ValueError(f"{key} must be > 0")
    return value


def _parse_rope(raw: dict[str, Any], max_pos: int) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        raise UnsupportedModel("per-layer-type rope_parameters are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModel(f"rope_type {rope_type!r} is not supported",
                               supported=list(SUPPORTED_ROPE_TYPES))
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    original = params.get("original_max_position_embeddings")
    if rope_type in ("llama3", "yarn") and original is None:
        original = raw.get("original_max_position_embeddings", max_pos)

    def opt(key: str) -> float | None:
        value = params.get(key)
        return None if value is None else float(value)

    factor = params.get("factor")
    if rope_type in ("linear", "llama3") and factor is None:
        raise ModelLoadError(f"rope_type {rope_type!r} needs a factor")
    if rope_type == "yarn" and factor is None:
        factor = max_pos / float(original if original is not None else max_pos)
    return RopeConfig(
        rope_type=rope_type, theta=float(theta),
        factor=1.0 if factor is None else float(factor),
        partial_rotary_factor=float(partial),
        original_max_position_embeddings=None if original is None else int(original),
        low_freq_factor=opt("low_freq_factor"), high_freq_factor=opt("high_freq_factor"),
        beta_fast=opt("beta_fast"), beta_slow=opt("beta_slow"),
        attention_factor=opt("attention_factor"), mscale=opt("mscale"),
        mscale_all_dim=opt("mscale_all_dim"), truncate=bool(params.get("truncate", True)),
    )


def _layer_windows(raw: dict[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if model_type == "qwen2":
        if not raw.get("use_sliding_window", False) or window is None:
            return (None,) * layers
        if isinstance(layer_types, list) and len(layer_types) == layers:
            return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
        first = int(raw.get("max_window_layers", layers))
        return tuple(int(window) if i >= first else None for i in range(layers))
    if model_type == "mistral" and window is not None:
        return (int(window),) * layers
    return (None,) * layers
