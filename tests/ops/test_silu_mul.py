"""SiLU(gate) * up on the fused gate/up output: both paths against float64."""

from __future__ import annotations

import pytest
import torch

from dataplane.ops import OpsError, silu_and_mul

from .conftest import DEVICE, TOL


def ref_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.double().chunk(2, dim=-1)
    return g / (1 + torch.exp(-g)) * u


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inter", [1, 13, 1100])
def test_silu_and_mul_matches_float64(backend: str, dtype: torch.dtype, inter: int) -> None:
    gen = torch.Generator().manual_seed(inter)
    wide = (torch.randn(3, 2 * inter + 6, generator=gen) * 4).to(DEVICE, dtype)
    gate_up = wide[:, 3:3 + 2 * inter]  # row stride != 2I
    out = silu_and_mul(gate_up, backend)
    assert out.shape == (3, inter) and out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_silu_mul(gate_up), **TOL[dtype])


def test_odd_width_is_rejected() -> None:
    with pytest.raises(OpsError):
        silu_and_mul(torch.randn(2, 7, device=DEVICE), "triton")
