"""The LoRA expand folded into SiLU·mul, residual-add + RMSNorm and RoPE + KV write
(dataplane/ops/lora_fold.py): both paths against float64 references built from the
per-slot factors (``scale * (x A^T) B^T``), never from the fold's own tail layout."""

from __future__ import annotations

import math

import pytest
import torch

from dataplane.ops import OpsError, fused_add_rms_norm, rope_and_cache, silu_and_mul
from dataplane.ops.lora_fold import FoldedExpand

from .conftest import DEVICE, TOL

T, H, R, K = 5, 3, 8, 6  # rows, hot slots, padded rank, projection input width
ROW_SLOT = [2, -1, 0, 2, 1]
SLOT_RANK = [8, 2, 5]  # slot 1 and 2 hold lower ranks than R: zero-padded
SCALE = [0.5, 2.0, 1.25]


class Fixture:
    """x, per slot and slice A [r, K] / B [w, r] (float64), and the fold's tensors: the
    z tail as the augmented GEMM would emit it and B padded to [H, R, w]."""

    def __init__(self, widths: tuple[int, ...], dtype: torch.dtype, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.widths, self.dtype = widths, dtype
        self.x = torch.randn(T, K, generator=gen, dtype=torch.float64)
        self.a = [[torch.randn(r, K, generator=gen, dtype=torch.float64) / 2 for _ in widths]
                  for r in SLOT_RANK]
        self.b = [[torch.randn(w, r, generator=gen, dtype=torch.float64) / 2 for w in widths]
                  for r in SLOT_RANK]
        c = len(widths) * R
        tail = torch.zeros(T, H * c + 3, dtype=torch.float64)  # 3 spare columns
        b_pad = [torch.zeros(H, R, w, dtype=torch.float64) for w in widths]
        for s, r in enumerate(SLOT_RANK):
            for k in range(len(widths)):
                tail[:, s * c + k * R: s * c + k * R + r] = self.x @ self.a[s][k].t()
                b_pad[k][s, :r] = self.b[s][k].t()
        self.tail = tail.to(DEVICE, dtype)
        scale = torch.tensor(SCALE, dtype=torch.float32)[:, None].repeat(1, len(widths))
        self.fold = FoldedExpand(torch.tensor(ROW_SLOT, dtype=torch.int32, device=DEVICE),
                                 tuple(b.to(DEVICE, dtype).contiguous() for b in b_pad),
                                 scale.to(DEVICE))

    def delta(self, k: int) -> torch.Tensor:
        """float64 [T, w_k]: scale * (x A^T) B^T of each row's slot, from the factors."""
        out = torch.zeros(T, self.widths[k], dtype=torch.float64)
        for t, s in enumerate(ROW_SLOT):
            if s >= 0:
                z = (self.x[t] @ self.a[s][k].t()).to(self.dtype).double()  # tail precision
                out[t] = SCALE[s] * (z @ self.b[s][k].t())
        return out


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return TOL[dtype] if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_fold_matches_float64(backend: str, dtype: torch.dtype) -> None:
    inter = 13
    fx = Fixture((inter, inter), dtype, 1)
    gate_up = torch.randn(T, 2 * inter, generator=torch.Generator().manual_seed(2)
                          ).to(DEVICE, dtype)
    g = gate_up[:, :inter].double().cpu() + fx.delta(0)
    u = gate_up[:, inter:].double().cpu() + fx.delta(1)
    want = g / (1 + torch.exp(-g)) * u
    out = silu_and_mul(gate_up, backend, fold=fx.fold, tail=fx.tail)
    torch.testing.assert_close(out.double().cpu(), want, **_tol(dtype))
    plain = silu_and_mul(gate_up, backend)  # no fold: the slot rows' delta is not there
    assert not torch.allclose(plain.double().cpu(), want, **_tol(dtype))


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_fold_matches_float64(backend: str, dtype: torch.dtype) -> None:
    n = 24
    fx = Fixture((n,), dtype, 3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(T, n, generator=gen).to(DEVICE, dtype)
    residual = torch.randn(T, n, generator=gen).to(DEVICE, dtype)
    weight = (torch.rand(n, generator=gen) + 0.5).to(DEVICE, dtype)
    summed = x.double().cpu() + fx.delta(0) + residual.double().cpu()
    want = weight.double().cpu() * summed / torch.sqrt(summed.pow(2).mean(-1, keepdim=True)
                                                      + 1e-6)
    y, res = fused_add_rms_norm(x.clone(), residual.clone(), weight, 1e-6, backend,
                                fold=fx.fold, tail=fx.tail)
    torch.testing.assert_close(res.double().cpu(), summed, **_tol(dtype))
    torch.testing.assert_close(y.double().cpu(), want, **_tol(dtype))


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(
        torch.ones_like(angles), angles)[:, None, :]
    return torch.cat((z.real, z.imag), dim=-1)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_cache_fold_matches_float64(backend: str, dtype: torch.dtype) -> None:
    hq, hkv, d = 4, 2, 10
    fx = Fixture((hq * d, hkv * d, hkv * d), dtype, 5)
    gen = torch.Generator().manual_seed(6)
    qkv = torch.randn(T, (hq + 2 * hkv) * d, generator=gen).to(DEVICE, dtype)
    base = qkv.double().cpu()
    q, k, v = (qkv[:, :hq * d].view(T, hq, d), qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d),
               qkv[:, (hq + hkv) * d:].view(T, hkv, d))
    angles = torch.rand(T, d // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    cos, sin = angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)
    angles = torch.atan2(sin.double().cpu(), cos.double().cpu())  # the table's own angles
    k_cache = torch.zeros(11, hkv, d, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros(11, hkv, d, dtype=dtype, device=DEVICE)
    slots = torch.tensor([7, 2, 9, 0, 4], device=DEVICE)
    q_out, k_out = rope_and_cache(q, k, v, cos, sin, k_cache, v_cache, slots, backend,
                                  fold=fx.fold, tail=fx.tail)
    radius = (cos.double().cpu() ** 2 + sin.double().cpu() ** 2).sqrt()[:, None, :]
    want_q = _rotate((base[:, :hq * d] + fx.delta(0)).view(T, hq, d), angles)
    want_k = _rotate((base[:, hq * d:(hq + hkv) * d] + fx.delta(1)).view(T, hkv, d), angles)
    want_q, want_k = (w * torch.cat((radius, radius), -1) for w in (want_q, want_k))
    want_v = (base[:, (hq + hkv) * d:] + fx.delta(2)).view(T, hkv, d)
    tol = _tol(dtype)
    torch.testing.assert_close(q_out.double().cpu(), want_q, **tol)
    torch.testing.assert_close(k_out.double().cpu(), want_k, **tol)
    torch.testing.assert_close(k_cache[slots].double().cpu(), want_k, **tol)
    torch.testing.assert_close(v_cache[slots].double().cpu(), want_v, **tol)
    torch.testing.assert_close(v.double().cpu(), want_v, **tol)  # v updated in place


def test_fold_that_does_not_fit_is_refused() -> None:
    fx = Fixture((8, 8), torch.float32, 7)
    gate_up = torch.randn(T, 18, device=DEVICE)  # inter 9, B holds 8 columns
    for backend in ("triton", "torch"):
        with pytest.raises(OpsError, match="folded LoRA"):
            silu_and_mul(gate_up, backend, fold=fx.fold, tail=fx.tail)
    short = fx.tail[:, :H * 2 * R - 1]
    with pytest.raises(OpsError, match="folded LoRA"):
        silu_and_mul(torch.randn(T, 16, device=DEVICE), "torch", fold=fx.fold, tail=short)
