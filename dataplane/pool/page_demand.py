"""Page demand derived from an adapter's tensors, and the joint admission inequality.

Demand counts *every* module, *both* factors and *every* layer:
it is computed by the same row placement that later writes the bytes, so what the
ledger reserves is exactly what the copy fills.

Storage orientation is the kernels' (``dataplane.kernels.base``): ``A`` rank rows are
``[r, d_in]`` and ``B`` is stored transposed, rank rows ``[r, d_out]``; each rank row
must be one contiguous run of elements, so a row never straddles a page. Rows are
packed first-fit in canonical order — sorted ``(layer, module)``, then the ``A`` rows,
then the ``Bt`` rows, each ``physical_rank`` rows (rows beyond the logical rank are
zero padding) — so a page of ``E`` elements holds ``floor(E / width)`` rows of one
tensor. When every width divides ``E`` this equals
``sum_m ceil(r d_in / E) + ceil(d_out r / E)`` up to sharing a page between tensors;
e.g. the sixteen-page admission example of the pool tests (q/k/v/o, rank 1, H = 8,
L = 2, pages of 2·L·H = 32 elements) packs 16 rows of 8 elements into exactly
``4 * rank = 4`` pages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from dataplane.pool.errors import AdmissionRefused, LayoutError


@dataclass(frozen=True)
class PageGeometry:
    """Every page holds ``page_elems`` elements of ``elem_bytes`` bytes."""

    page_elems: int
    elem_bytes: int

    def __post_init__(self) -> None:
        if self.page_elems <= 0 or self.elem_bytes <= 0:
            raise LayoutError(f"bad geometry {self}")

    @property
    def page_bytes(self) -> int:
        return self.page_elems * self.elem_bytes


@dataclass(frozen=True, order=True)
class FactorShape:
    """One adapted module of one layer: ``A [rank, d_in]``, ``B [d_out, rank]``.

    ``physical_rank`` (>= rank) is the stored row count; rows ``rank..physical_rank-1``
    are zero (fixed-rank slots). ``scale`` is the semantic scale s.
    """

    layer: int
    module: str
    rank: int
    d_in: int
    d_out: int
    physical_rank: int
    scale: Fraction

    def __post_init__(self) -> None:
        if self.layer < 0 or not self.module:
            raise LayoutError(f"bad module key ({self.layer}, {self.module!r})")
        if not 0 < self.rank <= self.physical_rank or self.d_in <= 0 or self.d_out <= 0:
            raise LayoutError(f"bad factor shape {self}")

    @property
    def key(self) -> tuple[int, str]:
        return (self.layer, self.module)


@dataclass(frozen=True)
class ModuleRows:
    """Where one module's rank rows live: ``(local_page, element_offset_in_page)``.

    ``a[i]`` locates ``A[i, :]`` (``d_in`` elements), ``b[i]`` locates ``B[:, i]``
    (``d_out`` elements); ``len(a) == len(b) == physical_rank``.
    """

    shape: FactorShape
    a: tuple[tuple[int, int], ...]
    b: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class RowPlan:
    """Placement of every rank row of one adapter into ``num_pages`` local pages.

    ``used[p]`` is the number of leading elements of local page ``p`` holding rows;
    the rest of each page is tail padding that must be zero.
    """

    geometry: PageGeometry
    modules: tuple[ModuleRows, ...]
    num_pages: int
    used: tuple[int, ...]

    def module(self, layer: int, module: str) -> ModuleRows:
        for m in self.modules:
            if m.shape.key == (layer, module):
                return m
        raise LayoutError(f"no module ({layer}, {module!r}) in this adapter")


def plan_rows(shapes: Iterable[FactorShape], geometry: PageGeometry) -> RowPlan:
    """Place all rank rows first-fit in canonical order (see module docstring)."""
    ordered = sorted(shapes, key=lambda s: s.key)
    if not ordered:
        raise LayoutError("an adapter needs at least one module")
    if len({s.key for s in ordered}) != len(ordered):
        raise LayoutError("a (layer, module) appears twice")
    e = geometry.page_elems
    used: list[int] = [0]
    modules: list[ModuleRows] = []

    def place(width: int) -> tuple[int, int]:
        if width > e:
            raise LayoutError(f"a rank row of {width} elements exceeds the page ({e})")
        if used[-1] + width > e:
            used.append(0)
        spot = (len(used) - 1, used[-1])
        used[-1] += width
        return spot

    for s in ordered:
        a = tuple(place(s.d_in) for _ in range(s.physical_rank))
        b = tuple(place(s.d_out) for _ in range(s.physical_rank))
        modules.append(ModuleRows(s, a, b))
    return RowPlan(geometry, tuple(modules), len(used), tuple(used))


def adapter_page_demand(shapes: Iterable[FactorShape], geometry: PageGeometry) -> int:
    """Pages one adapter generation occupies in ``geometry`` (``P_a``)."""
    return plan_rows(shapes, geometry).num_pages


@dataclass(frozen=True)
class AdmissionDemand:
    """The right-hand side of the admission inequality, in pages."""

    adapter_incremental: int
    kv_initial: int
    kv_growth: int
    guard: int = 0

    def __post_init__(self) -> None:
        if min(self.adapter_incremental, self.kv_initial, self.kv_growth, self.guard) < 0:
            raise AdmissionRefused(f"negative demand {self}")

    @property
    def kv_pages(self) -> int:
        return self.kv_initial + self.kv_growth

    @property
    def committed(self) -> int:
        """Pages the transaction takes: adapter + KV initial + KV growth (guard stays free)."""
        return self.adapter_incremental + self.kv_pages

    @property
    def total(self) -> int:
        return self.committed + self.guard


def check_admission(free: int, reclaimable: int, demand: AdmissionDemand) -> None:
    """Raise :class:`AdmissionRefused` unless ``free + reclaimable >= demand.total``.

    Necessary, not sufficient: validity, ABI and restore-ability are checked
    by the transaction itself.
    """
    if free + reclaimable < demand.total:
        raise AdmissionRefused(
            f"free {free} + reclaimable {reclaimable} < demand {demand.total} "
            f"(adapter {demand.adapter_incremental}, kv {demand.kv_initial}+"
            f"{demand.kv_growth}, guard {demand.guard})",
            free=free, reclaimable=reclaimable, demand=demand.total,
        )
