"""RMSNorm and fused residual-add + RMSNorm: Triton (interpreted on CPU) and torch paths
against a float64 reference, odd hidden sizes, in-place contract of the fused kernel."""

from __future__ import annotations

import pytest
import torch

from dataplane.ops import OpsError, fused_add_rms_norm, rms_norm

from .conftest import DEVICE, TOL

EPS = 1e-5


def ref_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64: w * x / sqrt(mean(x^2) + eps)."""
    h = x.double()
    return w.double() * h / torch.sqrt((h * h).mean(-1, keepdim=True) + EPS)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [7, 33, 96])
def test_rms_norm_matches_float64(backend: str, dtype: torch.dtype, hidden: int) -> None:
    gen = torch.Generator().manual_seed(hidden)
    x = (torch.randn(3, hidden, generator=gen) * 3).to(DEVICE, dtype)
    w = torch.randn(hidden, generator=gen).to(DEVICE, dtype)
    before = x.clone()
    y = rms_norm(x, w, EPS, backend)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.double(), ref_rms_norm(x, w), **TOL[dtype])
    assert torch.equal(x, before)  # plain norm never writes its input


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [5, 65])
def test_fused_add_rms_norm_matches_float64(backend: str, dtype: torch.dtype,
                                            hidden: int) -> None:
    gen = torch.Generator().manual_seed(100 + hidden)
    x = torch.randn(4, hidden, generator=gen).to(DEVICE, dtype)
    r = (torch.randn(4, hidden, generator=gen) * 2).to(DEVICE, dtype)
    w = torch.randn(hidden, generator=gen).to(DEVICE, dtype)
    want_sum = x.double() + r.double()
    want = ref_rms_norm(want_sum, w)
    y, summed = fused_add_rms_norm(x.clone(), r.clone(), w, EPS, backend)
    torch.testing.assert_close(summed.double(), want_sum, **TOL[dtype])
    torch.testing.assert_close(y.double(), want, **TOL[dtype])


def test_fused_triton_kernel_writes_in_place_on_strided_rows() -> None:
    """Rows of a wider buffer (row stride != hidden): results land in x and residual."""
    gen = torch.Generator().manual_seed(7)
    big_x = torch.randn(3, 20, generator=gen).to(DEVICE)
    big_r = torch.randn(3, 24, generator=gen).to(DEVICE)
    x, r = big_x[:, 2:13], big_r[:, 5:16]
    w = torch.randn(11, generator=gen).to(DEVICE)
    want_sum = x.double() + r.double()
    want = ref_rms_norm(want_sum, w)
    untouched_x, untouched_r = big_x[:, 13:].clone(), big_r[:, :5].clone()
    y, summed = fused_add_rms_norm(x, r, w, EPS, "triton")
    assert y.data_ptr() == x.data_ptr() and summed.data_ptr() == r.data_ptr()
    torch.testing.assert_close(big_x[:, 2:13].double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(big_r[:, 5:16].double(), want_sum, atol=1e-6, rtol=1e-6)
    assert torch.equal(big_x[:, 13:], untouched_x) and torch.equal(big_r[:, :5], untouched_r)


def test_bad_shapes_raise_typed_error() -> None:
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(OpsError):
        rms_norm(x, torch.ones(7, device=DEVICE), EPS, "triton")
    with pytest.raises(OpsError):
        fused_add_rms_norm(x, torch.randn(2, 9, device=DEVICE), torch.ones(8, device=DEVICE),
                           EPS, "triton")
    with pytest.raises(OpsError):
        rms_norm(x.t(), torch.ones(2, device=DEVICE), EPS, "triton")  # column stride != 1
