"""Rotary position embeddings with HF's scaling variants (default, linear, llama3, yarn).

Inverse frequencies follow transformers' `modeling_rope_utils` formulas bit for bit (fp32);
cos/sin are computed once per step from absolute positions (so there is no length cap) and
cast to the activation dtype; `dataplane.ops.rope_and_cache` applies them with HF Llama's
half-rotation convention.
"""

from __future__ import annotations

import math

import torch

from dataplane.models.config import RopeConfig
from dataplane.models.errors import UnsupportedModel


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] fp32, attention_factor applied to cos/sin)."""
    if rope.partial_rotary_factor != 1.0:
        raise UnsupportedModel("partial_rotary_factor != 1 is not supported")
    dim = head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, dim)
    raise UnsupportedModel(f"rope_type {rope.rope_type!r} is not supported")


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    if rope.low_freq_factor is None or rope.high_freq_factor is None:
        raise UnsupportedModel("llama3 rope needs low_freq_factor and high_freq_factor")
    factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    old_len = float(rope.original_max_position_embeddings or 0)
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor
    original = float(rope.original_max_position_embeddings or 0)

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = get_mscale(factor, rope.mscale) / get_mscale(
                factor, rope.mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = rope.beta_fast or 32.0, rope.beta_slow or 1.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    inv_freq = interpolation * (1 - extra_factor) + extrapolation * extra_factor
    return inv_freq, float(attention_factor)


class RotaryEmbedding(torch.nn.Module):
    """Inverse frequencies of one RoPE variant; `cos_sin` gives a step's tables."""

    inv_freq: torch.Tensor

    def __init__(self, rope: RopeConfig, head_dim: int,
                 device: torch.device | None = None) -> None:
        super().__init__()
        inv_freq, self.attention_factor = rope_inv_freq(rope, head_dim)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> (cos, sin) each [T, head_dim / 2] in `dtype`.

        Half width: HF's tables repeat these columns twice (cat(freqs, freqs)); the
        rotation (dataplane.ops.rope_and_cache) reads each column for both halves, so
        the values are HF's exactly (attention factor applied before the cast).
        """
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)
