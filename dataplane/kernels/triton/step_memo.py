"""Per-step memo of the two-kernel LoRA launches (host time of eager steps).

Every layer of one step calls the LoRA branch of each projection kind with the same row
grouping, the same shapes and the same workspace; only the activations and that layer's
factor tables differ. The first call of a kind in a step validates, picks configs, views
the bottleneck ``z`` in the workspace and prepares the launches (`ops.prepare_*`,
`fused_ops.prepare_fused`); the next layers' calls reuse that after comparing shapes,
dtypes and strides, and go straight to the launches. An 8B eager step makes 128 such
calls.

The memo forgets everything when the step's metadata or workspace object changes, so a
config table edited between steps (``load_tuned``) is seen by the next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dataplane.kernels.base import LoraBatchMeta, LoraModuleWeights, LoraWorkspace
from dataplane.triton_launch import LaunchPlan

Prepared = tuple[LaunchPlan, tuple[int, ...], tuple[int, ...]]  # plan, grid, integer args


@dataclass(frozen=True)
class MemoEntry:
    """One projection kind's launches in this step; ``x_shape`` / ``y_shape`` / ``dtype``
    are what a later call must match to reuse them. Two kernels: ``z`` is the bottleneck
    view, ``launches`` the shrink and the expand (plain or folded into SiLU·mul); the
    fused decode launch: ``z`` is the workspace's scratch, ``launches`` that one launch."""

    x_shape: torch.Size
    y_shape: torch.Size
    dtype: torch.dtype
    z: torch.Tensor
    launches: tuple[Prepared, ...]

    @property
    def fused(self) -> bool:
        return len(self.launches) == 1


class StepMemo:
    def __init__(self) -> None:
        self.meta: LoraBatchMeta | None = None
        self.workspace: LoraWorkspace | None = None
        self.entries: dict[tuple[Any, ...], MemoEntry] = {}

    @staticmethod
    def key(kind: str, x: torch.Tensor, y: torch.Tensor,
            weights: LoraModuleWeights) -> tuple[Any, ...]:
        return (kind, weights.geometry, x.stride(), y.stride(), x.device)

    def get(self, meta: LoraBatchMeta, workspace: LoraWorkspace | None, key: tuple[Any, ...],
            x: torch.Tensor, y: torch.Tensor) -> MemoEntry | None:
        if workspace is None:
            return None
        if meta is not self.meta or workspace is not self.workspace:
            self.meta, self.workspace, self.entries = meta, workspace, {}
            return None
        entry = self.entries.get(key)
        if entry is None or x.shape != entry.x_shape or y.shape != entry.y_shape:
            return None
        if x.dtype != entry.dtype or y.dtype != entry.dtype:
            return None
        return entry

    def put(self, key: tuple[Any, ...], entry: MemoEntry) -> None:
        self.entries[key] = entry
