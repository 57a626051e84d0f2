"""Attention tests: Triton kernels compiled on CUDA, interpreted on CPU."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # must happen before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")
