"""Pinned host mirrors of static device buffers, for the CUDA-graph runners' inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dataplane.core import BatchPlan


def stage_rows(plan: BatchPlan, rows: int, trash_slot: int, ids: np.ndarray,
               positions: np.ndarray, slots: np.ndarray, row_slot: np.ndarray) -> None:
    """Write the plan's T per-row inputs into host arrays and pad rows T..rows-1 (token 0,
    position 0, the KV write to `trash_slot`, adapter slot -1: no LoRA work, no KV write
    anyone reads)."""
    t = plan.num_rows
    ids[:t] = plan.input_ids
    positions[:t] = plan.positions
    slots[:t] = plan.slot_mapping
    row_slot[:t] = plan.row_slot
    if rows > t:
        ids[t:rows] = 0
        positions[t:rows] = 0
        slots[t:rows] = trash_slot
        row_slot[t:rows] = -1


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
