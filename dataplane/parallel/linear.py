"""Megatron-style parallel projections with a sharded multi-adapter LoRA branch.

Same call contract as `dataplane.layers.lora_linear.LoRALinear` (``forward(x, lora)``,
``lora`` = the step's `LoraStepContext` or None), so a decoder layer can hold either.

ColumnParallelLinear: x ``[T, d_in]`` replicated -> y ``[T, sum(w_k/N)]`` (this rank's
    part of every fused slice, in slice order); no collective on the base path.
RowParallelLinear: x ``[T, d_in/N]`` (this rank's input columns) -> y ``[T, d_out]``
    replicated, after one base all-reduce (bias added once, after it).

`enable_fold(fold_slots)` (default LoRA layout): the weight gains the fold slots' ``A`` rows
(dataplane/layers/lora_fold_store.py) and `forward_fold` returns ``(y, (z, expand))``
for the consumer op to add the expand (dataplane/ops/lora_fold.py): no LoRA launch. The
row-parallel ``z`` rides in the base all-reduce with ``y``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from dataplane.layers.lora_fold_store import FoldStore
from dataplane.layers.lora_linear import LoraStepContext
from dataplane.ops import silu_and_mul
from dataplane.ops.lora_fold import FoldedExpand
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.errors import ShardShapeError
from dataplane.parallel.lora_tp import GlobalSliceFactors, ShardedLoraBranch
from dataplane.parallel.shard import (
    COLUMN,
    LAYOUT_LOCAL,
    ROW,
    shard_column_weight,
    shard_interval,
    shard_row_weight,
)

ROW_AUG_BLAS = "cublaslt"
"""The library of the row-parallel augmented GEMMs (o, down at TP=2: 7,168 -> 4,096 + z):
cuBLAS picks split-K plus a reduce kernel for the down shard's augmented shape, where
cuBLASLt's single kernel is about 20% faster."""


@contextmanager
def blas_library(name: str) -> Iterator[None]:
    """GEMMs issued inside use `name` (torch's process-wide preferred BLAS library)."""
    prev = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


class _ParallelLinear(nn.Module):
    style: str
    owns_lora_tables = True
    """ModelRunner contract: a linear with this flag keeps its own (sharded) LoRA tables;
    the runner allocates no `LoraFactorTable` for it and leaves its `factors` alone."""

    def __init__(self, group: TPGroup, in_features: int, out_features: tuple[int, ...],
                 slice_names: tuple[str, ...], bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        if len(slice_names) != len(out_features):
            raise ShardShapeError("one name per output slice")
        self.group = group
        self.in_features, self.out_features = in_features, out_features
        self.slice_names = slice_names
        total = sum(out_features)
        self.weight = nn.Parameter(torch.zeros(total, in_features, dtype=dtype,
                                               device=group.device), requires_grad=False)
        self.bias = (nn.Parameter(torch.zeros(total, dtype=dtype, device=group.device),
                                  requires_grad=False) if bias else None)
        self.branch: ShardedLoraBranch | None = None
        self.fold: FoldStore | None = None
        self.trace: dict[str, torch.Tensor] | None = None

    def _copy_weight(self, local: torch.Tensor, bias: torch.Tensor | None) -> None:
        if tuple(local.shape) != tuple(self.weight.shape):
            raise ShardShapeError(f"local weight {list(local.shape)} != "
                                  f"{list(self.weight.shape)}")
        if (bias is None) != (self.bias is None):
            raise ShardShapeError("bias given for a module without one (or missing)")
        if bias is not None and self.bias is not None and bias.shape != self.bias.shape:
            raise ShardShapeError(f"bias {list(bias.shape)} != {list(self.bias.shape)}")
        with torch.no_grad():
            self.weight.copy_(local)
            if bias is not None and self.bias is not None:
                self.bias.copy_(bias)

    def enable_lora(self, layout: str, *, num_slots: int, max_rank: int,
                    bottleneck_dtype: torch.dtype = torch.float32) -> ShardedLoraBranch:
        """Attach an (empty) sharded LoRA table in `layout`; returns it."""
        self.branch = ShardedLoraBranch(
            self.style, layout, self.group, num_slots=num_slots,
            in_features=self.in_features, out_features=self.out_features,
            max_rank=max_rank, dtype=self.weight.dtype, out_units=self._out_units(),
            out_replicate=self._out_replicate(), bottleneck_dtype=bottleneck_dtype)
        return self.branch

    def enable_fold(self, fold_slots: int) -> FoldStore:
        """A fold of `fold_slots` slots in the base GEMM (module docstring); the base weight
        becomes a view of the augmented one. The caller fills it and keeps it in step with
        this projection's table (`FoldSlots.attach`). Default layout only."""
        if self.branch is None or self.branch.layout != LAYOUT_LOCAL:
            raise ShardShapeError("a LoRA fold needs LoRA in the no_extra_collectives layout")
        store = FoldStore(self.weight.detach(), self.branch.table.out_features, fold_slots,
                          self.branch.table.max_rank)
        self.weight = nn.Parameter(store.weight_aug[:store.base_rows], requires_grad=False)
        self.fold = store
        return store

    def _gemm_aug(self, x: torch.Tensor, lora: LoraStepContext, reduce: bool
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, FoldedExpand]]:
        """``x [W; A_hot]^T`` (all-reduced when `reduce`: y and the ranks' partial z in the
        one base call), split into (y + bias, (z tail, this step's expand))."""
        assert self.fold is not None
        weight = self.fold.gemm_weight(lora.fold_width)
        if x.is_cuda and self.style != COLUMN:
            with blas_library(ROW_AUG_BLAS):
                y_aug = F.linear(x, weight)
        else:
            y_aug = F.linear(x, weight)
        if reduce:
            self.group.all_reduce(y_aug, purpose="base")
        assert lora.fold_slot is not None
        return self.fold.split(y_aug, self.bias, lora.fold_slot)

    def forward_fold(self, x: torch.Tensor, lora: LoraStepContext
                     ) -> tuple[torch.Tensor, tuple[torch.Tensor, FoldedExpand] | None]:
        """(y, (z tail, expand)): the base GEMM over the hot slots' ``A`` too, no launch;
        the caller's consumer op adds each row's expand. Row-parallel: after the base
        all-reduce, which completes ``z`` with ``y``. Plain `forward` without a fold."""
        if self.fold is None or self.trace is not None:
            return self(x, lora), None
        return self._gemm_aug(x, lora, reduce=self.style != COLUMN)

    def load_adapter(self, slot: int, factors: GlobalSliceFactors) -> None:
        """Shard one adapter's *global* factors into this rank's slot."""
        if self.branch is None:
            raise ShardShapeError("LoRA is not enabled on this module")
        self.branch.load_slot(slot, factors)

    def _out_units(self) -> tuple[int, ...]:
        return (1,) * len(self.out_features)

    def _out_replicate(self) -> tuple[bool, ...]:
        return (False,) * len(self.out_features)

    def _active_branch(self, lora: LoraStepContext | None) -> ShardedLoraBranch | None:
        """The branch to run this step: None without LoRA, or when no slot holds factors
        and the step allows skipping. Every rank loads the same slots (publication is
        all-ranks), so a paper-layout collective is skipped by all ranks or by none."""
        if lora is None or self.branch is None:
            return None
        return self.branch if (self.branch.local or not lora.skip_empty) else None


class ColumnParallelLinear(_ParallelLinear):
    """Output-sharded projection; fused slices (q/k/v, gate/up) sharded one by one.

    `global_out_features` are the global slice widths; `units` the shard unit per slice
    (head_dim for q/k/v so GQA kv heads split on head boundaries); `replicate[k]`: slice
    k's units are shared by several ranks when they are fewer than the ranks (k/v heads).
    """

    style = COLUMN

    def __init__(self, group: TPGroup, in_features: int, global_out_features: tuple[int, ...],
                 slice_names: tuple[str, ...], *, bias: bool = False,
                 dtype: torch.dtype = torch.float32,
                 units: tuple[int, ...] | None = None,
                 replicate: tuple[bool, ...] | None = None) -> None:
        self.units = units or (1,) * len(global_out_features)
        self.replicate = replicate or (False,) * len(global_out_features)
        self.global_out_features = global_out_features
        local = []
        for k, (w, u, rep) in enumerate(zip(global_out_features, self.units, self.replicate,
                                            strict=True)):
            lo, hi = shard_interval(w, group.rank, group.size, what=f"slice {k}", unit=u,
                                    replicate=rep)
            local.append(hi - lo)
        super().__init__(group, in_features, tuple(local), slice_names, bias, dtype)

    def _out_units(self) -> tuple[int, ...]:
        return self.units

    def _out_replicate(self) -> tuple[bool, ...]:
        return self.replicate

    def load_global_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None
                           ) -> None:
        """Copy this rank's rows of the global fused weight ``[sum(widths), d_in]``."""
        g = self.group
        local = shard_column_weight(weight, self.global_out_features, g.rank, g.size,
                                    self.units, self.replicate)
        local_bias = (None if bias is None else
                      shard_column_weight(bias, self.global_out_features, g.rank, g.size,
                                          self.units, self.replicate))
        self._copy_weight(local, local_bias)

    def forward(self, x: torch.Tensor, lora: LoraStepContext | None) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        branch = self._active_branch(lora)
        if branch is not None and lora is not None:
            branch.apply(y, x, lora, trace=self.trace)
        if self.trace is not None:
            self.trace["output"] = y.clone()
        return y

    def forward_silu_mul(self, x: torch.Tensor, lora: LoraStepContext | None,
                         ops_backend: str = "auto") -> torch.Tensor:
        """The gate/up form the decoder layer calls (``LoRALinear.forward_silu_mul``): the
        local gate/up shard, its LoRA branch and the activation — with the expand folded
        into the activation where the backend has that path (default layout), as on one
        GPU; else the branch adds into the local output, then the activation."""
        branch = self._active_branch(lora)
        if branch is None or lora is None or self.trace is not None:
            return silu_and_mul(self.forward(x, lora), ops_backend)
        if lora.fold and self.fold is not None:
            y, (tail, fold) = self._gemm_aug(x, lora, reduce=False)
            return silu_and_mul(y, ops_backend, fold=fold, tail=tail)
        y = F.linear(x, self.weight, self.bias)
        act = branch.apply_silu_mul(y, x, lora)
        if act is not None:
            return act
        branch.apply(y, x, lora)
        return silu_and_mul(y, ops_backend)


class RowParallelLinear(_ParallelLinear):
    """Input-sharded projection; one base all-reduce carries the LoRA output too."""

    style = ROW

    def __init__(self, group: TPGroup, global_in_features: int, out_features: int,
                 slice_name: str, *, bias: bool = False,
                 dtype: torch.dtype = torch.float32) -> None:
        lo, hi = shard_interval(global_in_features, group.rank, group.size,
                                what="row-parallel input")
        self.global_in_features = global_in_features
        super().__init__(group, hi - lo, (out_features,), (slice_name,), bias, dtype)
        self.out_slice = shard_interval(out_features, group.rank, group.size,
                                        what="row-parallel output") \
            if out_features % group.size == 0 else None

    def load_global_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None
                           ) -> None:
        """Copy this rank's input columns of the global weight ``[d_out, d_in]``."""
        self._copy_weight(shard_row_weight(weight, self.group.rank, self.group.size), bias)

    def forward(self, x: torch.Tensor, lora: LoraStepContext | None) -> torch.Tensor:
        y = F.linear(x, self.weight)
        branch = self._active_branch(lora)
        if branch is not None and lora is not None:
            branch.apply(y, x, lora, out_slice=self.out_slice, trace=self.trace)
        self.group.all_reduce(y, purpose="base")
        if self.bias is not None:
            y = y + self.bias
        if self.trace is not None:
            self.trace["output"] = y.clone()
        return y
