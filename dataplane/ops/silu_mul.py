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
from dataplane.ops.lora_fold import FoldedExpand, add_folded


def silu_and_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    """Reference: F.silu(gate) * up in the input dtype."""
    inter = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :inter]) * gate_up[..., inter:]


def silu_and_mul(gate_up: torch.Tensor, backend: str = "auto",
                 fold: FoldedExpand | None = None, tail: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """[T, 2I] -> [T, I] (module docstring). With `fold` and `tail` (the gate/up GEMM's
    z columns, dataplane/ops/lora_fold.py) gate and up first get each row's LoRA expand."""
    if not use_triton(gate_up, backend):
        if fold is not None and tail is not None:
            inter = gate_up.shape[-1] // 2
            fold.check(tail, (inter, inter))
            gate_up = torch.cat((add_folded(gate_up[:, :inter], tail, fold, 0),
                                 add_folded(gate_up[:, inter:], tail, fold, 1)), dim=1)
        return silu_and_mul_torch(gate_up)
    from dataplane.ops.triton.silu_mul import silu_and_mul_triton

    return silu_and_mul_triton(gate_up, fold, tail)
