"""Pack an adapter's factors into page payload on the host, and read them back.

The payload is the exact byte image the device pages will hold: a
``[num_pages, page_elems]`` tensor laid out by :func:`plan_rows` (A rank rows, Bt rank
rows, zero padding rows beyond the logical rank, zero page tails). The host tier keeps
this image, so a load is one H2D copy plus a page-index scatter, and a rollback reloads
a victim from the same verified image. ``bytes_digest`` (SHA-256 of the payload bytes)
is what "digest-checked before the copy" checks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import torch

from dataplane.pool.errors import LayoutError
from dataplane.pool.page_demand import FactorShape, ModuleRows, PageGeometry, RowPlan, plan_rows

ModuleKey = tuple[int, str]
"""``(layer, module_name)``, e.g. ``(0, "q_proj")``."""

Factors = Mapping[ModuleKey, tuple[torch.Tensor, torch.Tensor, Fraction]]
"""``(A [r, d_in], B [d_out, r] (PEFT orientation), scale)`` per module of every layer."""

_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


class ModuleFactorsLike(Protocol):
    """One adapted projection as the engine's PEFT reader returns it."""

    @property
    def layer(self) -> int: ...

    @property
    def module(self) -> str: ...

    @property
    def a(self) -> torch.Tensor: ...

    @property
    def b(self) -> torch.Tensor: ...

    @property
    def scale(self) -> float: ...


def factors_from_modules(modules: Iterable[ModuleFactorsLike]) -> dict[ModuleKey, tuple[
        torch.Tensor, torch.Tensor, Fraction]]:
    """``Factors`` from ``(layer, module, A, B, scale)`` records (e.g. the engine's
    ``LoadedAdapter.modules``); a float scale converts exactly (binary fraction)."""
    out: dict[ModuleKey, tuple[torch.Tensor, torch.Tensor, Fraction]] = {}
    for m in modules:
        key = (m.layer, m.module)
        if key in out:
            raise LayoutError(f"module {key} appears twice")
        out[key] = (m.a, m.b, Fraction(m.scale))
    return out


@dataclass(frozen=True)
class PackedAdapter:
    """Verified host image of one artifact in one page geometry."""

    digest: str
    plan: RowPlan
    payload: torch.Tensor
    bytes_digest: str

    @property
    def num_pages(self) -> int:
        return self.plan.num_pages

    @property
    def nbytes(self) -> int:
        return self.payload.numel() * self.payload.element_size()


def payload_digest(payload: torch.Tensor) -> str:
    """SHA-256 hex of a CPU tensor's bytes (row-major)."""
    data = payload.detach().contiguous().cpu().view(torch.uint8).numpy()
    return hashlib.sha256(data.tobytes()).hexdigest()


def factor_shapes(factors: Factors, physical_rank: int | None = None) -> list[FactorShape]:
    """Shapes of every module, validated: ``A [r, d_in]`` and ``B [d_out, r]`` agree."""
    shapes = []
    for (layer, module), (a, b, scale) in factors.items():
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise LayoutError(f"({layer}, {module}): A {list(a.shape)} / B {list(b.shape)} "
                              "are not [r, d_in] / [d_out, r]")
        rank = int(a.shape[0])
        phys = rank if physical_rank is None else physical_rank
        if phys < rank:
            raise LayoutError(f"({layer}, {module}): rank {rank} > physical rank {phys}")
        shapes.append(FactorShape(layer, module, rank, int(a.shape[1]), int(b.shape[0]),
                                  phys, Fraction(scale)))
    return shapes


def pack_adapter(
    digest: str,
    factors: Factors,
    geometry: PageGeometry,
    dtype: torch.dtype,
    physical_rank: int | None = None,
) -> PackedAdapter:
    """Lay out ``factors`` into a zero-initialised ``[P, page_elems]`` host payload."""
    if dtype not in _SUPPORTED or torch.tensor([], dtype=dtype).element_size() != (
        geometry.elem_bytes
    ):
        raise LayoutError(f"dtype {dtype} does not match geometry {geometry}")
    plan = plan_rows(factor_shapes(factors, physical_rank), geometry)
    payload = torch.zeros(plan.num_pages, geometry.page_elems, dtype=dtype)
    for m in plan.modules:
        a, b, _ = factors[m.shape.key]
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise LayoutError(f"{m.shape.key}: non-finite factor values")
        bt = b.t()
        for i in range(m.shape.rank):
            _put(payload, m.a[i], a[i])
            _put(payload, m.b[i], bt[i])
    return PackedAdapter(digest, plan, payload, payload_digest(payload))


def _put(payload: torch.Tensor, spot: tuple[int, int], row: torch.Tensor) -> None:
    page, off = spot
    payload[page, off : off + row.numel()] = row.to(payload.dtype)


def row_offsets(rows: ModuleRows, pages: tuple[int, ...], page_elems: int) -> tuple[
    tuple[int, ...], tuple[int, ...]
]:
    """Element offsets in the flat pool of every A and Bt rank row (physical rank)."""
    a = tuple(pages[p] * page_elems + off for p, off in rows.a)
    b = tuple(pages[p] * page_elems + off for p, off in rows.b)
    return a, b


def read_module(
    flat: torch.Tensor, pages: tuple[int, ...], rows: ModuleRows, page_elems: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``(A [R, d_in], B [d_out, R])`` at physical rank R from the flat pool."""
    a_off, b_off = row_offsets(rows, pages, page_elems)
    s = rows.shape
    a = torch.stack([flat[o : o + s.d_in] for o in a_off])
    bt = torch.stack([flat[o : o + s.d_out] for o in b_off])
    return a, bt.t()
