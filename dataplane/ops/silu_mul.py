"""SiLU-gated MLP activation on the fused gate/up projection output.

    silu_and_mul(gate_up [T, 2I]) -> out [T, I] = silu(gate_up[:, :I]) * gate_up[:, I:]

The Triton kernel (ops/triton/silu_mul.py) computes in fp32 and rounds once to the input
dtype (the torch reference rounds silu(gate) to the dtype first, as HF does: the two
differ by at most one rounding). gate_up needs unit column stride; `out` is a new tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dataplane.ops.backend import use_triton


def silu_and_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    """Reference: F.silu(gate) * up in the input dtype."""
    inter = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :inter]) * gate_up[..., inter:]


def silu_and_mul(gate_up: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """[T, 2I] -> [T, I] (module docstring)."""
    if not use_triton(gate_up, backend):
        return silu_and_mul_torch(gate_up)
    from dataplane.ops.triton.silu_mul import silu_and_mul_triton

    return silu_and_mul_triton(gate_up)
