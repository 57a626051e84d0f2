"""Linear projection = one shared base GEMM + the kernels' heterogeneous low-rank branch.

`LoRALinear` holds the base weight of one projection, or of several fused projections
(q/k/v, gate/up) stacked along the output axis as *slices*. Each step, rows of the packed
batch carry an adapter slot (`row_slot`, -1 = base); the LoRA backend adds
`scale[k, s] * (x A[k, s]^T) B[k, s]^T` to slice k of every row with slot s and leaves rows
with slot -1 (and slices an adapter does not target, rank 0) exactly untouched. Adapters
of different ranks and target sets share one call (rank/scale tables per slot).

Under tensor parallelism a rank's projections are `LoRALinear`s of its local shapes
(dataplane/parallel/shard_model.py) holding its shard of every adapter in its own pool:
a column-parallel shard needs nothing more (its input is replicated); a row-parallel shard
(o, down) has `reduce` set, and its base partial and LoRA partial are summed over the
ranks by one all-reduce, before the bias (docs/ARCHITECTURE.md, "Tensor parallelism").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from dataplane.kernels.base import LoraBackend, LoraBatchMeta, LoraModuleWeights, LoraWorkspace
from dataplane.kernels.factor_table import LoraFactorTable
from dataplane.layers.collection_table import CollectionRows, CollectionTable
from dataplane.layers.lora_fold_store import FoldStore
from dataplane.ops import silu_and_mul
from dataplane.ops.lora_fold import FoldedExpand

ROW_AUG_BLAS = "cublaslt"
"""The library of a row-parallel shard's augmented (folded) GEMM: for the down shard's
augmented shape cuBLAS picks split-K plus a reduce kernel, where cuBLASLt's single kernel
is about 20% faster (docs/PERFORMANCE.md, "Tensor parallel")."""


class AllReduce(Protocol):
    """What a row-parallel shard needs of its TP group (dataplane.parallel.TPGroup)."""

    def all_reduce(self, tensor: torch.Tensor, *, purpose: str) -> torch.Tensor: ...


@contextmanager
def blas_library(name: str) -> Iterator[None]:
    """GEMMs issued inside use `name` (torch's process-wide preferred BLAS library)."""
    prev = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


class FactorSource(Protocol):
    """Where a LoRA linear reads every slot's factors: the engine's `LoraFactorTable`, or
    an external store (the unified page pool's address tables)."""

    @property
    def weights(self) -> LoraModuleWeights: ...


@dataclass(frozen=True)
class LoraStepContext:
    """What every LoRA linear needs for one step: backend, row grouping, scratch.

    Built once per step by the model runner (one plan, shared by all layers).
    """

    backend: LoraBackend
    meta: LoraBatchMeta
    workspace: LoraWorkspace
    skip_empty: bool = True
    """Skip projections no loaded adapter targets (host-side check). False inside CUDA-graph
    capture, so that an adapter registered after capture still reaches every projection."""
    fold_slot: torch.Tensor | None = None
    """Each row's fold slot (int32 [T], -1 = no adapter) when the step folds: projections
    that hold a fold (dataplane/layers/lora_fold_store.py) then run their shrink inside the
    base GEMM and leave the expand to their consumer op. The runner sets it for steps of at
    most the model's `lora_fold_rows` rows (`FoldSlots.rows`)."""
    fold_width: int = 0
    """Fold slots the step's GEMMs read (`FoldSlots.step_width`: every row's fold slot is
    below it); 0: all of them."""
    collection_rows: list[CollectionRows] = field(default_factory=list)
    """The step's `CollectionRows`, built by the first projection that reads a collection
    table (dataplane/layers/collection_table.py) and shared by the rest."""
    pending: list[tuple[torch.Tensor, FoldedExpand]] = field(default_factory=list)
    """A folded down projection's (z tail, expand), waiting for the next layer's add-norm
    (or the end of the model): the one fold that crosses a layer boundary."""

    @property
    def fold(self) -> bool:
        return self.fold_slot is not None

    def take_pending(self) -> tuple[torch.Tensor, FoldedExpand] | None:
        return self.pending.pop() if self.pending else None


class LoRALinear(nn.Module):
    """y[T, sum(out_features)] = x[T, in] W^T (+ b) + LoRA delta of each row's slot.

    `slice_names` are the PEFT module names of the fused slices in output order (e.g.
    ("q_proj", "k_proj", "v_proj")); `out_features` their widths. `factors` is attached
    by the engine when adapters are enabled (one table for every slot); None = base only.
    """

    def __init__(self, in_features: int, slice_names: tuple[str, ...],
                 out_features: tuple[int, ...], bias: bool, dtype: torch.dtype,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self.in_features = in_features
        self.slice_names = slice_names
        self.out_features = out_features
        total = sum(out_features)
        self.weight = nn.Parameter(torch.empty(total, in_features, dtype=dtype, device=device),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.zeros(total, dtype=dtype, device=device),
                                  requires_grad=False) if bias else None)
        self.factors: LoraFactorTable | FactorSource | None = None
        self.has_factors = False
        """Host-side: some slot has rank > 0 in `factors` (kept by the adapter loader)."""
        self.fold: FoldStore | None = None
        """The LoRA fold of this projection (`enable_fold`), or None."""
        self.collection: CollectionTable | None = None
        """Shared bases and per-slot cores of natively served collection members (attached
        by the runner when the engine has collection blocks), or None."""
        self.reduce: AllReduce | None = None
        """A row-parallel TP shard's group: the output (base + LoRA partials) is
        all-reduced, then the bias added. None: a whole projection or a column shard."""

    def attach_factors(self, source: FactorSource | None) -> None:
        """Read factors from `source` from now on (None: base only); clears `has_factors`
        until the owner of `source` calls :meth:`set_adapted`."""
        self.factors, self.has_factors = source, False

    def enable_fold(self, fold_slots: int, max_rank: int) -> FoldStore:
        """A fold of `fold_slots` slots in the base GEMM (dataplane/layers/
        lora_fold_store.py): the base weight becomes a view of the augmented one. The
        caller fills it and keeps it in step with the factor table (`FoldSlots.attach`)."""
        store = FoldStore(self.weight.detach(), self.out_features, fold_slots, max_rank)
        self.weight = nn.Parameter(store.weight_aug[:store.base_rows], requires_grad=False)
        self.fold = store
        return store

    def forward_fold(self, x: torch.Tensor, lora: LoraStepContext
                     ) -> tuple[torch.Tensor, tuple[torch.Tensor, FoldedExpand] | None]:
        """(y, (z tail, expand)): the shrink of every slot inside the base GEMM, no launch;
        the caller's consumer op adds each row's expand. Plain `forward` without a fold."""
        if self.fold is None:
            return self(x, lora), None
        assert lora.fold_slot is not None
        weight = self.fold.gemm_weight(lora.fold_width)
        if self.reduce is None:
            y_aug = F.linear(x, weight)
        else:  # the ranks' partial z rides in the base all-reduce with y
            if x.is_cuda:
                with blas_library(ROW_AUG_BLAS):
                    y_aug = F.linear(x, weight)
            else:
                y_aug = F.linear(x, weight)
            self.reduce.all_reduce(y_aug, purpose="base")
        y, folded = self.fold.split(y_aug, self.bias, lora.fold_slot)
        self._add_collection(y, x, lora)
        return y, folded

    def _add_collection(self, y: torch.Tensor, x: torch.Tensor,
                        lora: LoraStepContext | None) -> None:
        """Collection members' three-stage delta (dataplane/layers/collection_table.py)."""
        table = self.collection
        if table is not None and lora is not None and (table.active or not lora.skip_empty):
            if not lora.collection_rows:
                lora.collection_rows.append(table.rows(lora.meta.row_slot[:x.shape[0]]))
            table.add_delta(y, x, lora.meta.row_slot, lora.collection_rows[0])

    def set_adapted(self, adapted: bool) -> None:
        """Public form of the host-side `has_factors` flag: True iff some slot of the
        attached source adapts one of this linear's slices."""
        self.has_factors = bool(adapted)

    def slice_rows(self, name: str) -> tuple[int, int]:
        """[start, end) output rows of slice `name` inside the fused weight."""
        start = 0
        for slice_name, width in zip(self.slice_names, self.out_features, strict=True):
            if slice_name == name:
                return start, start + width
            start += width
        raise KeyError(name)

    def _active(self, lora: LoraStepContext | None) -> LoraModuleWeights | None:
        """This step's factors, or None when the step has no LoRA branch here."""
        if lora is None or self.factors is None or not (self.has_factors or not lora.skip_empty):
            return None
        return self.factors.weights

    def forward(self, x: torch.Tensor, lora: LoraStepContext | None) -> torch.Tensor:
        if self.reduce is not None:
            return self._forward_row_shard(x, lora)
        y = F.linear(x, self.weight, self.bias)
        self._add_collection(y, x, lora)
        w = self._active(lora)
        if w is not None and lora is not None:
            lora.backend.add_lora(y, x, lora.meta, w, lora.workspace)
        return y

    def _forward_row_shard(self, x: torch.Tensor, lora: LoraStepContext | None
                           ) -> torch.Tensor:
        """A row-parallel shard: ``x_j W_j^T + s (x_j A_j^T) B^T`` summed over the ranks
        (``sum_j x_j A_j^T = x A^T``: no collective of its own), then the bias."""
        assert self.reduce is not None
        y = F.linear(x, self.weight)
        w = self._active(lora)
        if w is not None and lora is not None:
            lora.backend.add_lora(y, x, lora.meta, w, lora.workspace)
        self.reduce.all_reduce(y, purpose="base")
        return y if self.bias is None else y + self.bias

    def forward_silu_mul(self, x: torch.Tensor, lora: LoraStepContext | None,
                         ops_backend: str = "auto") -> torch.Tensor:
        """``silu_and_mul(self(x, lora))`` for a gate/up projection, with the LoRA expand
        folded into the activation where the backend has that path (the same math, one
        rounding fewer: ``gate + Δgate`` is not rounded to the dtype first)."""
        if lora is not None and lora.fold_slot is not None and self.fold is not None:
            y, (tail, fold) = self.fold.split(
                F.linear(x, self.fold.gemm_weight(lora.fold_width)), self.bias, lora.fold_slot)
            self._add_collection(y, x, lora)
            return silu_and_mul(y, ops_backend, fold=fold, tail=tail)
        y = F.linear(x, self.weight, self.bias)
        self._add_collection(y, x, lora)
        w = self._active(lora)
        if w is not None and lora is not None:
            act = lora.backend.add_lora_silu_mul(y, x, lora.meta, w, lora.workspace)
            if act is not None:
                return act
            lora.backend.add_lora(y, x, lora.meta, w, lora.workspace)
        return silu_and_mul(y, ops_backend)
