"""Which implementation a fused op runs: the Triton kernel or the torch reference.

`OPS_BACKENDS`: "auto" (Triton when the tensor is on CUDA, torch otherwise), "torch",
"triton" (also on CPU tensors, which needs TRITON_INTERPRET=1: tests only). The choice is
a per-model setting (`LlamaForCausalLM.set_ops_backend`), read once per op call with no
environment lookup, so the host cost per call is one attribute test.
"""

from __future__ import annotations

import torch

from dataplane.ops.errors import OpsError

OPS_BACKENDS = ("auto", "torch", "triton")


def check_ops_backend(name: str) -> str:
    """`name` if it is a known backend, else OpsError."""
    if name not in OPS_BACKENDS:
        raise OpsError(f"unknown ops backend {name!r}, want one of {OPS_BACKENDS}")
    return name


def use_triton(x: torch.Tensor, backend: str) -> bool:
    """Run the Triton kernel for `x` under `backend` (see module docstring)."""
    if backend == "auto":
        return x.is_cuda
    return backend == "triton"
