"""RMSNorm exactly as HF Llama computes it (fp32 statistics, weight applied in input dtype).

The math lives in `dataplane.ops.rms_norm` (Triton kernel on CUDA, torch reference
elsewhere); `ops_backend` ("auto" | "torch" | "triton") picks the path.
"""

from __future__ import annotations

import torch
from torch import nn

from dataplane.ops import fused_add_rms_norm, rms_norm
from dataplane.ops.lora_fold import FoldedExpand


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)); statistics in fp32, result in x's dtype."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)
        self.eps = eps
        self.ops_backend = "auto"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, N] -> RMSNorm(x) [T, N] (x is not modified)."""
        return rms_norm(x, self.weight, self.eps, self.ops_backend)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor,
                    folded: tuple[torch.Tensor, FoldedExpand] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(x + residual), x + residual). May reuse the buffers of x and residual:
        callers must not read either input afterwards. `folded` = (z tail, expand) of the
        projection that produced x: its LoRA expand is added to x first."""
        fold, tail = (folded[1], folded[0]) if folded is not None else (None, None)
        return fused_add_rms_norm(x, residual, self.weight, self.eps, self.ops_backend,
                                  fold=fold, tail=tail)
