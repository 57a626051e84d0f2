"""Pinned host mirrors of static device buffers, for the CUDA-graph runners' inputs."""

from __future__ import annotations

from typing import Any

import torch


class Staging:
    """A device buffer and its host mirror (pinned on CUDA) with a numpy view for fast
    fills. `upload(n)` copies the first n elements asynchronously and records an event;
    `wait()` blocks until that copy has read the host buffer (normally long done: the
    engine syncs on the sampled tokens every step), so refilling never races a copy."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.host = torch.zeros(numel, dtype=dtype, pin_memory=cuda)
        self.array = self.host.numpy()
        self.device = torch.zeros(numel, dtype=dtype, device=device)
        self._event: Any = torch.cuda.Event() if cuda else None
        self._pending = False

    def upload(self, n: int) -> None:
        self.device[:n].copy_(self.host[:n], non_blocking=True)
        if self._event is not None:
            self._event.record()
            self._pending = True

    def wait(self) -> None:
        if self._pending:
            self._event.synchronize()
            self._pending = False
