"""The projections' GEMMs: decode-sized ones under cuBLASLt.

At decode sizes cuBLAS picks split-K plus a reduce kernel for some of Llama-8B's
projections, cuBLASLt does not (`bench/lora_fold.py --gemms`, one H200, 64 rows, µs per
GEMM): one GPU's down 40.4 -> 32.8 and gate/up 63.5 -> 60.7, a TP=2 rank's down shard
20.3 -> 18.9, q/k/v and o unchanged; the LoRA fold's augmented GEMMs alike (one GPU's
down 41.5 -> 34.3). Steps of at most `LT_MAX_ROWS` rows on CUDA take cuBLASLt, base path
and fold alike; larger ones (prefill, mixed) keep torch's default.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

LT_MAX_ROWS = 256
"""Largest row count (a decode graph's batch) whose projection GEMMs run under cuBLASLt."""


@contextmanager
def blas_library(name: str) -> Iterator[None]:
    """GEMMs issued inside use `name` (torch's process-wide preferred BLAS library)."""
    prev = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``F.linear``, under cuBLASLt for CUDA steps of at most `LT_MAX_ROWS` rows."""
    if x.is_cuda and x.shape[0] <= LT_MAX_ROWS:
        with blas_library("cublaslt"):
            return F.linear(x, weight, bias)
    return F.linear(x, weight, bias)
