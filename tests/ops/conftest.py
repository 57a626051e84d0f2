"""Fused-op tests: Triton kernels run in the CPU interpreter without CUDA (shapes stay
tiny: the interpreter is slow). The interpreter converts fp32 -> bf16 by truncation (the
GPU rounds to nearest), so bf16 tolerances allow one bf16 ulp per rounding."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # must precede the first import of dataplane.ops
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dataplane.models  # noqa: F401  (before dataplane.layers: they import each other)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""Where the non-`gpu` tests run the kernels: interpreted on CPU, compiled on a GPU box."""

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
"""Triton / torch paths against float64 references."""
