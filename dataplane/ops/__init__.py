"""Fused elementwise ops of the decoder: one Triton kernel each on CUDA, torch elsewhere.

Each op has a torch reference (CPU path, and the oracle of its tests) and a Triton kernel
that is CUDA-graph capturable (no host sync, allocation only through torch):
`rms_norm` / `fused_add_rms_norm` (rms_norm.py), `silu_and_mul` (silu_mul.py) and
`rope_and_cache` (rotary_kv.py: RoPE on q/k in place + the paged KV cache write). The
`backend` argument ("auto" | "torch" | "triton") picks the path (backend.py). Kernels live
in ops/triton/ and are imported on first use: the torch paths never import Triton.
"""

from __future__ import annotations

from dataplane.ops.backend import OPS_BACKENDS, check_ops_backend, use_triton
from dataplane.ops.errors import OpsError
from dataplane.ops.rms_norm import fused_add_rms_norm, rms_norm, rms_norm_torch
from dataplane.ops.rotary_kv import apply_rotary_torch, rope_and_cache
from dataplane.ops.silu_mul import silu_and_mul, silu_and_mul_torch

__all__ = [
    "OPS_BACKENDS",
    "OpsError",
    "apply_rotary_torch",
    "check_ops_backend",
    "fused_add_rms_norm",
    "rms_norm",
    "rms_norm_torch",
    "rope_and_cache",
    "silu_and_mul",
    "silu_and_mul_torch",
    "use_triton",
]
