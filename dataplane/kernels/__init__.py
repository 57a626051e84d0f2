"""Multi-adapter LoRA kernels behind one small backend interface.

Usage by an engine (one step)::

    backend = get_lora_backend(device)
    buffers = LoraMetaBuffers(max_rows, num_slots, device)          # once
    workspace = LoraWorkspace(backend.workspace_numel(max_rows, 3, max_rank), device)
    meta = backend.build_meta(row_slot, buffers)                    # once per step
    backend.add_lora(y_qkv, x, meta, qkv_weights, workspace)        # per (layer, module)

Implementations are imported lazily: the torch path never imports Triton.
"""

from __future__ import annotations

import os

import torch

from dataplane.kernels.base import (
    LoraBackend,
    LoraBatchMeta,
    LoraMetaBuffers,
    LoraModuleWeights,
    LoraWorkspace,
)
from dataplane.kernels.errors import (
    LoraBackendUnavailable,
    LoraKernelError,
    LoraRankError,
    LoraShapeError,
    LoraSlotError,
)
from dataplane.kernels.factor_table import LoraFactorTable

__all__ = [
    "LoraBackend",
    "LoraBackendUnavailable",
    "LoraBatchMeta",
    "LoraFactorTable",
    "LoraKernelError",
    "LoraMetaBuffers",
    "LoraModuleWeights",
    "LoraRankError",
    "LoraShapeError",
    "LoraSlotError",
    "LoraWorkspace",
    "get_lora_backend",
]


def triton_interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def get_lora_backend(device: torch.device | str, prefer: str | None = None) -> LoraBackend:
    """Pick the backend for ``device``: Triton on CUDA, torch on CPU.

    ``prefer`` (or env ``ADAPTERPLANE_LORA_BACKEND``) may be ``"torch"`` or
    ``"triton"``; Triton on a CPU device needs ``TRITON_INTERPRET=1`` (tests).
    """
    dev = torch.device(device)
    choice = (
        prefer
        or os.environ.get("ADAPTERPLANE_LORA_BACKEND")
        or ("triton" if dev.type == "cuda" else "torch")
    )
    if choice == "torch":
        from dataplane.kernels.torch_backend import TorchLoraBackend

        return TorchLoraBackend()
    if choice != "triton":
        raise LoraBackendUnavailable(f"unknown backend {choice!r}")
    if dev.type != "cuda" and not triton_interpreter_enabled():
        raise LoraBackendUnavailable("triton on CPU needs TRITON_INTERPRET=1")
    try:
        from dataplane.kernels.triton.backend import TritonLoraBackend
    except ImportError as exc:  # pragma: no cover - triton is a test dependency
        raise LoraBackendUnavailable(f"triton not importable: {exc}") from exc
    return TritonLoraBackend()
