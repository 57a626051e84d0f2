"""Host-to-device copies that do not wait for the GPU.

``tensor.to("cuda")`` from pageable host memory synchronizes the stream: the host waits
until every kernel already queued has finished. On an eager (prefill or mixed) step that
happens a dozen times (ids, positions, slot maps, block tables, row slots, sample rows),
each one draining the queue that async scheduling keeps full, and the last one, after
the forward is queued, makes the host wait for the whole forward. On CUDA these helpers
stage the data in pinned memory (torch's caching host allocator keeps the block alive
until the copy's stream event completes) and copy with ``non_blocking=True``; elsewhere
they are plain conversions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def to_device(values: Sequence[Any], dtype: torch.dtype,
              device: torch.device | str) -> torch.Tensor:
    """``torch.tensor(values, dtype)`` on ``device`` without a host-side wait."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def upload(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor.to(device)`` for a CPU tensor, without a host-side wait on CUDA."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
