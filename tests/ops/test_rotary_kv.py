"""RoPE on q/k (in place on the Triton path) fused with the paged KV cache write, both
paths against a float64 complex-rotation reference; every RoPE variant's cos/sin table
from RotaryEmbedding against float64 angles."""

from __future__ import annotations

import pytest
import torch

from dataplane.layers.rotary import RotaryEmbedding, rope_inv_freq
from dataplane.models.config import RopeConfig
from dataplane.ops import OpsError, rope_and_cache

from .conftest import DEVICE, TOL

T, HQ, HKV, D = 3, 4, 2, 10  # D/2 = 5: not a power of two
SLOTS = torch.tensor([7, 2, 9], device=DEVICE)
NUM_SLOTS = 11


def ref_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """float64: each pair (x[j], x[j + D/2]) as a complex number times (cos + i sin)."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    rot = z * torch.complex(cos.double(), sin.double())[:, None, :]
    return torch.cat((rot.real, rot.imag), dim=-1)


def _qkv(dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(T, (HQ + 2 * HKV) * D + 3, generator=gen).to(DEVICE, dtype)[:, :-3]


def _split(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = qkv[:, :HQ * D].view(T, HQ, D)
    k = qkv[:, HQ * D:(HQ + HKV) * D].view(T, HKV, D)
    v = qkv[:, (HQ + HKV) * D:].view(T, HKV, D)
    return q, k, v


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_cache_matches_float64(backend: str, dtype: torch.dtype) -> None:
    qkv = _qkv(dtype, 1)
    q0, k0, v0 = (t.clone() for t in _split(qkv))
    angles = (torch.rand(T, D // 2, generator=torch.Generator().manual_seed(2)) * 6.28).to(DEVICE)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    k_cache = torch.zeros(NUM_SLOTS, HKV, D, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros(NUM_SLOTS, HKV, D, dtype=dtype, device=DEVICE)
    q, k, v = _split(qkv)
    q_out, k_out = rope_and_cache(q, k, v, cos, sin, k_cache, v_cache, SLOTS, backend)
    want_q, want_k = ref_rotate(q0, cos, sin), ref_rotate(k0, cos, sin)
    torch.testing.assert_close(q_out.double(), want_q, **TOL[dtype])
    torch.testing.assert_close(k_out.double(), want_k, **TOL[dtype])
    torch.testing.assert_close(k_cache[SLOTS].double(), want_k, **TOL[dtype])
    assert torch.equal(v_cache[SLOTS], v0)
    others = torch.ones(NUM_SLOTS, dtype=torch.bool, device=DEVICE)
    others[SLOTS] = False
    assert not k_cache[others].any() and not v_cache[others].any()
    if backend == "triton":  # in place on the qkv buffer
        assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
        assert torch.equal(_split(qkv)[2], v0)


ROPES = [
    RopeConfig("default", 10000.0),
    RopeConfig("linear", 10000.0, factor=4.0),
    RopeConfig("llama3", 500000.0, factor=8.0, original_max_position_embeddings=64,
               low_freq_factor=1.0, high_freq_factor=4.0),
    RopeConfig("yarn", 10000.0, factor=4.0, original_max_position_embeddings=64),
]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: r.rope_type)
def test_cos_sin_tables_are_half_width_angles(rope: RopeConfig) -> None:
    """cos/sin [T, D/2] = attention_factor * cos/sin(position * inv_freq) (float64)."""
    head_dim = 16
    emb = RotaryEmbedding(rope, head_dim)
    positions = torch.tensor([0, 5, 63, 1000])
    cos, sin = emb.cos_sin(positions, torch.float32)
    inv_freq, factor = rope_inv_freq(rope, head_dim)
    angles = positions.double()[:, None] * inv_freq.double()[None, :]
    assert cos.shape == (4, head_dim // 2)
    torch.testing.assert_close(cos.double(), factor * angles.cos(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sin.double(), factor * angles.sin(), atol=1e-4, rtol=1e-4)


def test_inconsistent_shapes_raise_typed_error() -> None:
    q, k, v = _split(_qkv(torch.float32, 3))
    cache = torch.zeros(NUM_SLOTS, HKV, D, device=DEVICE)
    with pytest.raises(OpsError):
        wide = torch.ones(T, D, device=DEVICE)  # full width: cos/sin must be [T, D/2]
        rope_and_cache(q, k, v, wide, wide, cache, cache.clone(), SLOTS, "triton")
