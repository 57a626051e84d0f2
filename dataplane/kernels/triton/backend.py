"""Triton implementation of the LoRA backend (the GPU path).

Everything a step launches — metadata build, shrink, expand — reads only
device tensors and static shapes, so the whole step can be captured in a CUDA
graph. On a CPU device it runs under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from dataplane.kernels.base import (
    LoraBackend,
    LoraBatchMeta,
    LoraMetaBuffers,
    LoraModuleWeights,
    LoraWorkspace,
    check_call,
)
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.triton import fused_ops, ops, silu_ops
from dataplane.kernels.triton.configs import (
    FUSED_MAX_RANK,
    T_BUCKETS,
    fused_config,
    shrink_config,
    silu_config,
)
from dataplane.kernels.triton.meta_kernel import build_meta_triton
from dataplane.kernels.triton.step_memo import MemoEntry, StepMemo

FUSED, TWO_KERNEL, SILU_EXPAND = "fused", "two_kernel", "silu_expand"
"""The Triton backend's launch paths (`TritonLoraBackend.kernel_path`)."""


def _op(launch: Callable[..., None], registered: Callable[..., None]) -> Callable[..., None]:
    """The launcher itself in eager steps and CUDA-graph captures; the registered torch
    custom op only under ``torch.compile`` tracing. (The custom-op dispatcher costs tens
    of µs of host time per call: 128-256 LoRA calls per eager 8B step.)"""
    return registered if torch.compiler.is_compiling() else launch


def _expand_operands(meta: LoraBatchMeta, weights: LoraModuleWeights) -> tuple[torch.Tensor, ...]:
    """The expand kernels' factor and grouping tensors, in their launchers' order."""
    return (weights.storage, weights.b_rows, weights.ranks, weights.scales,
            meta.sorted_rows, meta.slot_counts, meta.slot_starts)


class TritonLoraBackend(LoraBackend):
    """Segmented shrink/expand kernels with mixed ranks and paged factors.

    ``add_lora`` on decode-sized steps (a fused config for ``T``, rank <= 128,
    a workspace sized by :meth:`workspace_numel`) is one fused launch; else,
    and always for :meth:`shrink` / :meth:`expand`, two kernels. ``fused=False``
    (or env ``ADAPTERPLANE_LORA_FUSED=0``) forces two kernels.
    """

    name = "triton"

    def __init__(self, fused: bool | None = None) -> None:
        if fused is None:
            fused = os.environ.get("ADAPTERPLANE_LORA_FUSED", "1") not in ("", "0")
        self.fused = fused
        self.memo = StepMemo()

    def build_meta(self, row_slot: torch.Tensor, buffers: LoraMetaBuffers) -> LoraBatchMeta:
        return build_meta_triton(row_slot, buffers)

    def kernel_path(self, rows: int, weights: LoraModuleWeights, gate_up: bool = False) -> str:
        """The one choice of launch for a step of `rows` rows on a projection of `weights`
        (docs/ARCHITECTURE.md, "LoRA execution paths"): "fused" (one launch: the row count
        has a tuned fused config and rank <= 128), else for a gate/up projection whose row
        count has a tuned SiLU config "silu_expand" (shrink, then the expand folded into
        SiLU·mul), else "two_kernel" (shrink + expand)."""
        outs = tuple(weights.out_features)
        if self.fused and fused_config(rows, weights.max_rank, weights.in_features,
                                       outs) is not None:
            return FUSED
        if gate_up and len(outs) == 2 and outs[0] == outs[1] \
                and silu_config(rows, weights.max_rank) is not None:
            return SILU_EXPAND
        return TWO_KERNEL

    def workspace_numel(self, max_rows: int, max_slices: int, max_rank: int) -> int:
        need = 0
        for edge in T_BUCKETS:
            rows = min(edge, max_rows)
            # split for the largest K is the upper bound: in_features only lowers it
            split = shrink_config(rows, max_rank, 1 << 30).split_k
            need = max(need, split * rows)
            if edge >= max_rows:
                break
        need *= max_slices * max_rank
        if max_rank <= FUSED_MAX_RANK:  # fused decode scratch (split-K partials)
            need = max(need, fused_ops.fused_scratch_numel(fused_ops.FUSED_MAX_PROGRAMS, max_rank))
        return need

    def add_lora(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace | None = None,
    ) -> None:
        """One fused launch for decode-sized steps, else shrink + expand."""
        key = StepMemo.key("add", x, y, weights)
        e = self.memo.get(meta, workspace, key, x, y)
        if e is not None:  # a later layer of this step: prepared by the first
            (self._launch_fused if e.fused else self._launch_two)(e, y, x, meta, weights)
            return
        if self.kernel_path(meta.num_rows, weights) != FUSED:
            self._two_kernel(key, y, x, meta, weights, workspace)
            return
        cfg = fused_config(
            meta.num_rows, weights.max_rank, weights.in_features, tuple(weights.out_features)
        )
        assert cfg is not None
        check_call(x, y, meta, weights)
        memo = workspace is not None and not torch.compiler.is_compiling()
        workspace = self.workspace_for(meta, weights, workspace, x.device)
        if not fused_ops.fused_fits(
            meta.num_rows, meta.num_slots, weights.in_features, tuple(weights.out_features),
            weights.max_rank, cfg, workspace.buffer.numel(), workspace.COUNTERS, x.device,
        ):  # fmt: skip
            super().add_lora(y, x, meta, weights, workspace)
            return
        if memo:
            e = MemoEntry(x.shape, y.shape, x.dtype, workspace.buffer, (fused_ops.prepare_fused(
                x, y, weights.a_rows, workspace.buffer, workspace.counters,
                weights.out_features, weights.addr_align),))
            self.memo.put(key, e)
            self._launch_fused(e, y, x, meta, weights)
            return
        _op(fused_ops.launch_fused, torch.ops.adapterplane.lora_fused)(
            y,
            x,
            weights.storage,
            weights.a_rows,
            weights.b_rows,
            weights.ranks,
            weights.scales,
            meta.sorted_rows,
            meta.slot_counts,
            meta.slot_starts,
            workspace.buffer,
            workspace.counters,
            list(weights.out_features),
            weights.addr_align,
        )

    def _two_kernel(self, key: tuple[object, ...], y: torch.Tensor, x: torch.Tensor,
                    meta: LoraBatchMeta, weights: LoraModuleWeights,
                    workspace: LoraWorkspace | None) -> None:
        """Shrink + expand, prepared once per step and projection kind (``StepMemo``)."""
        if workspace is None or torch.compiler.is_compiling():
            super().add_lora(y, x, meta, weights, workspace)
            return
        check_call(x, y, meta, weights)
        z = self._bottleneck(x, meta, weights, workspace)
        e = MemoEntry(x.shape, y.shape, x.dtype, z,
                      (ops.prepare_shrink(x, weights.ranks, z, weights.addr_align),
                       ops.prepare_expand(y, z, weights.ranks, weights.out_features,
                                          weights.addr_align)))
        self.memo.put(key, e)
        self._launch_two(e, y, x, meta, weights)

    @staticmethod
    def _launch_shrink(e: MemoEntry, x: torch.Tensor, meta: LoraBatchMeta,
                       weights: LoraModuleWeights) -> None:
        plan, grid, ints = e.launches[0]
        plan(grid, x, weights.storage, weights.a_rows, weights.ranks, e.z, meta.sorted_rows,
             meta.slot_counts, meta.slot_starts, *ints)

    @classmethod
    def _launch_two(cls, e: MemoEntry, y: torch.Tensor, x: torch.Tensor, meta: LoraBatchMeta,
                    weights: LoraModuleWeights) -> None:
        cls._launch_shrink(e, x, meta, weights)
        plan, grid, ints = e.launches[1]
        plan(grid, y, e.z, *_expand_operands(meta, weights), *ints)

    def _launch_fused(self, e: MemoEntry, y: torch.Tensor, x: torch.Tensor,
                      meta: LoraBatchMeta, weights: LoraModuleWeights) -> None:
        plan, grid, ints = e.launches[0]
        counters = self.memo.workspace.counters  # type: ignore[union-attr]
        plan(grid, x, y, weights.storage, weights.a_rows, weights.b_rows, weights.ranks,
             weights.scales, e.z, counters, meta.sorted_rows, meta.slot_counts,
             meta.slot_starts, *ints)

    def add_lora_silu_mul(
        self,
        gate_up: torch.Tensor,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace | None = None,
    ) -> torch.Tensor | None:
        """Two-kernel steps whose T class has a ``SILU_TABLE`` entry: the shrink,
        then the expand folded into SiLU·mul (``expand_silu_kernel.py``). Others
        return None; so do decode-sized steps (their fused launch is one node and
        ``gate_up`` is small there)."""
        outs = weights.out_features
        key = StepMemo.key("silu", x, gate_up, weights)
        e = self.memo.get(meta, workspace, key, x, gate_up)
        # the first gate/up of this step (or no memo): decide and prepare
        if e is None and self.kernel_path(meta.num_rows, weights, gate_up=True) != SILU_EXPAND:
            return None
        out = torch.empty(meta.num_rows, outs[0], dtype=gate_up.dtype, device=gate_up.device)
        if workspace is None or torch.compiler.is_compiling():
            check_call(x, gate_up, meta, weights)
            z = self.shrink(x, meta, weights, self.workspace_for(meta, weights, workspace,
                                                                 x.device))
            _op(silu_ops.launch_expand_silu, torch.ops.adapterplane.lora_expand_silu)(
                gate_up, out, z, *_expand_operands(meta, weights), weights.addr_align
            )
            return out
        if e is None:
            check_call(x, gate_up, meta, weights)
            z = self._bottleneck(x, meta, weights, workspace)
            e = MemoEntry(x.shape, gate_up.shape, x.dtype, z,
                          (ops.prepare_shrink(x, weights.ranks, z, weights.addr_align),
                           silu_ops.prepare_expand_silu(gate_up, out, z, weights.ranks,
                                                        weights.addr_align)))
            self.memo.put(key, e)
        self._launch_shrink(e, x, meta, weights)
        plan, grid, ints = e.launches[1]
        plan(grid, gate_up, out, e.z, *_expand_operands(meta, weights), *ints)
        return out

    @staticmethod
    def _bottleneck(x: torch.Tensor, meta: LoraBatchMeta, weights: LoraModuleWeights,
                    workspace: LoraWorkspace) -> torch.Tensor:
        if weights.num_slices > ops.MAX_SLICES:
            raise LoraShapeError(f"at most {ops.MAX_SLICES} slices per module")
        cfg = shrink_config(meta.num_rows, weights.max_rank, weights.in_features)
        return workspace.bottleneck(cfg.split_k, meta.num_rows, weights.num_slices,
                                    weights.max_rank)

    def shrink(
        self,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace,
    ) -> torch.Tensor:
        check_call(x, None, meta, weights)
        z = self._bottleneck(x, meta, weights, workspace)
        _op(ops.launch_shrink, torch.ops.adapterplane.lora_shrink)(
            x,
            weights.storage,
            weights.a_rows,
            weights.ranks,
            meta.sorted_rows,
            meta.slot_counts,
            meta.slot_starts,
            z,
            weights.addr_align,
        )
        return z

    def expand(
        self,
        y: torch.Tensor,
        z: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
    ) -> None:
        check_call(None, y, meta, weights)
        want = (meta.num_rows, weights.num_slices, weights.max_rank)
        if z.dim() != 4 or tuple(z.shape[1:]) != want or z.dtype != torch.float32:
            raise LoraShapeError(f"z: want float32 [splits, {', '.join(map(str, want))}]")
        _op(ops.launch_expand, torch.ops.adapterplane.lora_expand)(
            y, z, *_expand_operands(meta, weights), list(weights.out_features),
            weights.addr_align,
        )
