"""Attention tests: Triton kernels compiled on CUDA, interpreted on CPU."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # must happen before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def cuda_device() -> torch.device:
    """The CUDA device for `gpu`-marked tests (skipped without CUDA)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda")
