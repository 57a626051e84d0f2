"""Backends under test: torch everywhere; Triton through the interpreter on CPU."""

from __future__ import annotations

import os

import pytest
import torch

from dataplane.kernels import LoraBackend, get_lora_backend
from dataplane.kernels.torch_backend import TorchLoraBackend

if not torch.cuda.is_available():
    # CI runs the Triton kernels on the CPU through the interpreter (the test
    # script sets this too); must happen before anything imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Every torch path explicitly ("auto" picks between them per step, covered by
# test_torch_paths.py and tests/engine).
CPU_BACKENDS = ["torch-loop", "torch-batched", "torch-grouped"]
if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    CPU_BACKENDS.append("triton")


def make_cpu_backend(name: str) -> LoraBackend:
    """Backend for one entry of :data:`CPU_BACKENDS` (``torch-<path>`` or ``triton``)."""
    if name.startswith("torch-"):
        return TorchLoraBackend(path=name.removeprefix("torch-"))
    return get_lora_backend("cpu", prefer=name)


@pytest.fixture(params=CPU_BACKENDS)
def cpu_backend(request: pytest.FixtureRequest) -> LoraBackend:
    """Each backend that can run on this machine's CPU."""
    return make_cpu_backend(str(request.param))


@pytest.fixture
def cuda_device() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda")
