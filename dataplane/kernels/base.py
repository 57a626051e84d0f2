"""The LoRA backend interface: per-step metadata, per-module factor tables, ops.

Math (docs/ARCHITECTURE.md, "LoRA execution paths"). For a projection with ``NS`` output slices
(1 for o_proj/down_proj, 3 for fused q/k/v, 2 for gate/up), every scheduler row
``t`` with slot ``s = row_slot[t] >= 0`` gets, for every slice ``k``::

    z[t, k, :r]            = x[t] @ A[k, s][:r].T                 (shrink)
    y[t, off_k:off_k+w_k] += scale[k, s] * z[t, k, :r] @ Bt[k, s][:r]  (expand)

with ``r = ranks[k, s]``. ``r == 0`` (module absent for that slot) and
``s == -1`` (no adapter) give an exact zero delta: ``y`` is not touched.

Three objects, built at three different times:

* :class:`LoraBatchMeta` — once per engine step, shared by every layer and
  module: the row → slot map and the rows stable-sorted by slot. Built on the
  device into preallocated :class:`LoraMetaBuffers` without a host sync.
* :class:`LoraModuleWeights` — once per (layer, module) when slots change: the
  per-slot rank and scale tables and the *row-address tables* that locate every
  rank row of every factor inside one flat storage tensor (the unified page pool,
  docs/ARCHITECTURE.md, "The unified pool"). A contiguous stacked layout is the same
  thing with regular addresses (:class:`dataplane.kernels.factor_table.LoraFactorTable`).
* :class:`LoraWorkspace` — once per engine: scratch for the bottleneck ``z``.

Factor orientation in storage: ``A`` rank rows are ``[r, in_features]`` (PEFT's
``lora_A.weight`` as is); ``B`` is stored *transposed*, rank rows
``[r, out_features_k]`` (PEFT's ``lora_B.weight.T``), so each rank row of either
factor is one contiguous run of elements.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from dataplane.kernels.errors import LoraShapeError


@dataclass(frozen=True)
class LoraBatchMeta:
    """Row grouping for one step (views into :class:`LoraMetaBuffers`).

    Attributes:
        row_slot: int32 ``[T]`` slot of each scheduler row, ``-1`` = no adapter.
        sorted_rows: int32 ``[T]`` scheduler rows stable-sorted by slot: rows of
            slot 0 (ascending), then slot 1, …, then the ``-1`` rows last.
        slot_counts: int32 ``[S]`` rows per slot (``-1`` rows not counted).
        slot_starts: int32 ``[S]`` offset of each slot's run in ``sorted_rows``
            (exclusive prefix sum of ``slot_counts``).
        num_rows: ``T`` (a Python int: static for a CUDA graph).
        num_slots: ``S``.
    """

    row_slot: torch.Tensor
    sorted_rows: torch.Tensor
    slot_counts: torch.Tensor
    slot_starts: torch.Tensor
    num_rows: int
    num_slots: int


class LoraMetaBuffers:
    """Preallocated device buffers the per-step metadata is built into.

    One instance per engine (or per captured batch size). ``views(T)`` returns
    the metadata for the first ``T`` rows; building writes only into these
    buffers, so a graph-captured build allocates nothing.

    ``scratch``: int32 ``[2 * cdiv(max_rows, min_block) * slot_pad]`` for the
    multi-program build of large steps (per-block slot histograms and per-block
    scatter offsets, ``slot_pad`` = next power of two >= ``num_slots + 1``, at
    least 16); blocks of fewer than ``min_block`` rows are refused.
    """

    def __init__(
        self, max_rows: int, num_slots: int, device: torch.device | str, min_block: int = 128
    ) -> None:
        if max_rows <= 0 or num_slots <= 0 or min_block <= 0:
            raise LoraShapeError(
                f"max_rows={max_rows}, num_slots={num_slots}, min_block={min_block} must be > 0"
            )
        self.max_rows = max_rows
        self.num_slots = num_slots
        self.min_block = min_block
        self.slot_pad = max(16, 1 << num_slots.bit_length())  # next pow2 >= num_slots + 1
        i32 = torch.int32
        self.row_slot = torch.full((max_rows,), -1, dtype=i32, device=device)
        self.device = self.row_slot.device  # normalised ("cuda" -> "cuda:0")
        self.sorted_rows = torch.zeros(max_rows, dtype=i32, device=self.device)
        self.slot_counts = torch.zeros(num_slots, dtype=i32, device=self.device)
        self.slot_starts = torch.zeros(num_slots, dtype=i32, device=self.device)
        blocks = -(-max_rows // min_block)
        self.scratch = torch.zeros(2 * blocks * self.slot_pad, dtype=i32, device=self.device)

    def views(self, num_rows: int) -> LoraBatchMeta:
        if not 0 < num_rows <= self.max_rows:
            raise LoraShapeError(f"num_rows={num_rows} outside (0, {self.max_rows}]")
        return LoraBatchMeta(
            row_slot=self.row_slot[:num_rows],
            sorted_rows=self.sorted_rows[:num_rows],
            slot_counts=self.slot_counts,
            slot_starts=self.slot_starts,
            num_rows=num_rows,
            num_slots=self.num_slots,
        )


@dataclass(frozen=True)
class LoraModuleWeights:
    """Factor tables of one (layer, module) for every slot.

    Attributes:
        storage: 1-D ``[P]`` tensor (fp16/bf16/fp32) holding factor rank rows:
            the shared page pool viewed as elements, or a stacked table.
        a_rows: int64 ``[NS, S, R]``: element offset in ``storage`` of rank row
            ``i`` of ``A[k, s]`` (``in_features`` contiguous elements). Entries
            ``i >= ranks[k, s]`` are never read.
        b_rows: int64 ``[NS, S, R]``: element offset of rank row ``i`` of
            ``Bt[k, s]`` (``out_features[k]`` contiguous elements).
        ranks: int32 ``[NS, S]``, ``0 <= ranks <= R``; 0 = module absent.
        scales: float32 ``[NS, S]``: the semantic scale (alpha / r, …).
        in_features: ``d_in`` shared by every slice.
        out_features: width of every slice; ``y`` has ``sum(out_features)``
            columns, slice ``k`` starting at ``sum(out_features[:k])``.
        max_rank: ``R`` (physical rank of the address tables).
        stacked: optional fast path for the torch backend: per slice
            ``(A [S, R, d_in], Bt [S, R, w_k])`` views of ``storage`` that agree
            with the address tables (set by stacked layouts only).
        addr_align: a power of two (<= 16) dividing every row address and
            every slice width; lets kernels use wide vector loads. 1 is
            always correct; a larger value is a promise the producer keeps.
        slot_versions: optional host int64 ``[S]`` the producer bumps whenever
            it rewrites a slot (publication, reclaim): a consumer may keep a copy
            of a slot's factors while its version stands (the torch backend's
            grouped path, kernels/torch_grouped.py). None: no such promise.
    """

    storage: torch.Tensor
    a_rows: torch.Tensor
    b_rows: torch.Tensor
    ranks: torch.Tensor
    scales: torch.Tensor
    in_features: int
    out_features: tuple[int, ...]
    max_rank: int
    stacked: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = field(default=None)
    addr_align: int = 1
    slot_versions: np.ndarray | None = field(default=None)

    @property
    def num_slices(self) -> int:
        return len(self.out_features)

    @functools.cached_property
    def geometry(self) -> tuple[object, ...]:
        """Everything a launch over these tables depends on besides their addresses
        (computed once; the tables of every layer of one projection kind share it)."""
        return (self.in_features, self.out_features, self.max_rank, self.addr_align,
                self.storage.dtype, self.storage.device, tuple(self.ranks.shape))

    @property
    def num_slots(self) -> int:
        return int(self.ranks.shape[1])

    @property
    def total_out(self) -> int:
        return sum(self.out_features)

    def slice_offsets(self) -> tuple[int, ...]:
        offs, acc = [], 0
        for w in self.out_features:
            offs.append(acc)
            acc += w
        return tuple(offs)

    def validate(self) -> None:
        """Check table shapes/dtypes (host-side only, no device sync)."""
        ns, s, r = self.num_slices, self.num_slots, self.max_rank
        if ns < 1 or self.in_features <= 0 or any(w <= 0 for w in self.out_features):
            raise LoraShapeError("need >= 1 slice and positive in/out features")
        if self.addr_align not in (1, 2, 4, 8, 16) or any(
            w % self.addr_align for w in self.out_features
        ):
            raise LoraShapeError(f"addr_align {self.addr_align} must be a power of two <= 16")
        if self.storage.dim() != 1:
            raise LoraShapeError("storage must be 1-D")
        if self.storage.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise LoraShapeError(f"storage dtype {self.storage.dtype} unsupported")
        for name, t, shape, dt in (
            ("a_rows", self.a_rows, (ns, s, r), torch.int64),
            ("b_rows", self.b_rows, (ns, s, r), torch.int64),
            ("ranks", self.ranks, (ns, s), torch.int32),
            ("scales", self.scales, (ns, s), torch.float32),
        ):
            if tuple(t.shape) != shape or t.dtype != dt or not t.is_contiguous():
                raise LoraShapeError(
                    f"{name}: want contiguous {dt} {shape}, got {t.dtype} {tuple(t.shape)}"
                )
            if t.device != self.storage.device:
                raise LoraShapeError(f"{name} on {t.device}, storage on {self.storage.device}")


class LoraWorkspace:
    """Scratch for the bottleneck ``z`` (float32), allocated once.

    ``z`` for a call is a view ``[splits, T, NS, R]``; the backend decides
    ``splits`` (split-K partial sums, summed by expand). Size it with the
    backend's :meth:`LoraBackend.workspace_numel`.

    ``counters``: int64 ``[COUNTERS]``, one per split-K group of the Triton fused
    decode launch, which joins its partials through them; each launch adds a whole
    number of epochs (``fused_kernel.EPOCH``) to a counter it uses, so they are never
    reset. Launches sharing one workspace must not overlap in time: use one
    workspace per stream.
    """

    COUNTERS = 4096

    def __init__(self, numel: int, device: torch.device | str) -> None:
        self.buffer = torch.empty(max(numel, 1), dtype=torch.float32, device=device)
        self.counters = torch.zeros(self.COUNTERS, dtype=torch.int64, device=device)

    def bottleneck(self, splits: int, num_rows: int, num_slices: int, rank: int) -> torch.Tensor:
        need = splits * num_rows * num_slices * rank
        if need > self.buffer.numel():
            raise LoraShapeError(f"workspace holds {self.buffer.numel()} floats, need {need}")
        return self.buffer[:need].view(splits, num_rows, num_slices, rank)


class LoraBackend(ABC):
    """One implementation of the LoRA branch (Triton on CUDA, torch on CPU)."""

    name: str = "abstract"

    @abstractmethod
    def build_meta(self, row_slot: torch.Tensor, buffers: LoraMetaBuffers) -> LoraBatchMeta:
        """Group rows by slot for one step.

        Args:
            row_slot: int ``[T]`` on ``buffers.device``, values in ``[-1, S)``.
        Returns views of ``buffers``; no host sync on CUDA. Out-of-range slots
        are a caller bug the device cannot report without a sync: callers
        validate slots when they build the host plan.
        """

    @abstractmethod
    def workspace_numel(self, max_rows: int, max_slices: int, max_rank: int) -> int:
        """Floats a :class:`LoraWorkspace` needs for any call up to these sizes."""

    @abstractmethod
    def shrink(
        self,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace,
    ) -> torch.Tensor:
        """``z[t, k, :r] = x[t] @ A[k, slot(t)][:r].T`` for rows with a slot.

        Args:
            x: ``[T, in_features]``, row stride free, unit column stride,
                dtype of ``weights.storage``.
        Returns ``z`` float32 ``[splits, T, NS, R]``: split-K partial sums in
        a backend-private layout, meant only for the same backend's
        :meth:`expand`. With ``splits == 1`` (always for torch; for Triton when
        K fits one tile) ``z[0]`` is the bottleneck itself. The Triton backend
        picks how many leading splits to write on the device, so summing all
        of axis 0 is not valid there. Entries of rows without a slot or beyond
        the rank are unspecified and never read.
        """

    @abstractmethod
    def expand(
        self,
        y: torch.Tensor,
        z: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
    ) -> None:
        """``y[t, slice k] += scale[k, s] * z[t, k, :r] @ Bt[k, s][:r]`` in place.

        Args:
            y: ``[T, sum(out_features)]``, unit column stride, weights' dtype.
            z: as returned by :meth:`shrink`.
        Rows with slot ``-1`` and slices with rank 0 are not written.
        """

    def add_lora(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace | None = None,
    ) -> None:
        """Fused convenience: one shrink shared by all slices, then expand into ``y``.

        ``y`` ``[T, sum(out_features)]`` is the base projection output (fused
        q/k/v with GQA widths, or gate/up); it is updated in place.
        """
        z = self.shrink(x, meta, weights, self.workspace_for(meta, weights, workspace, x.device))
        self.expand(y, z, meta, weights)

    def workspace_for(self, meta: LoraBatchMeta, weights: LoraModuleWeights,
                      workspace: LoraWorkspace | None, device: torch.device) -> LoraWorkspace:
        """``workspace``, or a fresh one sized for this call when None."""
        if workspace is not None:
            return workspace
        return LoraWorkspace(
            self.workspace_numel(meta.num_rows, weights.num_slices, weights.max_rank), device
        )

    def add_lora_silu_mul(
        self,
        gate_up: torch.Tensor,
        x: torch.Tensor,
        meta: LoraBatchMeta,
        weights: LoraModuleWeights,
        workspace: LoraWorkspace | None = None,
    ) -> torch.Tensor | None:
        """``silu(gate + Δgate) * (up + Δup)`` ``[T, I]`` in one pass, or None.

        ``gate_up`` ``[T, 2I]`` is the base gate/up projection output (two slices of
        equal width); it is not modified. A backend returns None where it has no
        such path for this step: the caller then calls :meth:`add_lora` on
        ``gate_up`` and applies the activation itself. (Folding the expand into
        the activation saves the read-modify-write of ``gate_up``, the largest
        LoRA traffic of a prefill step.)
        """
        return None


def gather_rank_rows(storage: torch.Tensor, offsets: torch.Tensor, width: int) -> torch.Tensor:
    """``storage[offsets[..., None] + arange(width)]``: the rank rows that start at element
    `offsets` of the flat `storage`, shape ``[*offsets.shape, width]``, as one row gather
    from an overlapping view of `storage` (no element-wise index tensor)."""
    rows = storage.unfold(0, width, 1).index_select(0, offsets.reshape(-1).to(torch.int64))
    return rows.view(*offsets.shape, width)


def check_call(
    x: torch.Tensor | None, y: torch.Tensor | None, meta: LoraBatchMeta, w: LoraModuleWeights
) -> None:
    """Host-side shape checks shared by backends (no device sync)."""
    if w.num_slots != meta.num_slots:
        raise LoraShapeError(f"weights have {w.num_slots} slots, metadata {meta.num_slots}")
    if meta.sorted_rows.device != w.storage.device:
        raise LoraShapeError(
            f"metadata on {meta.sorted_rows.device}, factors on {w.storage.device}"
        )
    for name, t, width in (("x", x, w.in_features), ("y", y, w.total_out)):
        if t is None:
            continue
        if t.dim() != 2 or t.shape[0] != meta.num_rows or t.shape[1] != width:
            raise LoraShapeError(f"{name}: want [{meta.num_rows}, {width}], got {list(t.shape)}")
        if t.dtype != w.storage.dtype or t.device != w.storage.device:
            raise LoraShapeError(
                f"{name}: {t.dtype} on {t.device}, factors {w.storage.dtype} on {w.storage.device}"
            )
        if t.stride(1) != 1:
            raise LoraShapeError(f"{name} needs unit column stride")
