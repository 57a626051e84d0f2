"""One adapter's update for one module, kept factored: ΔW = s · B A, never densified.

Collection fitting only needs products with the update (`Δ V`, `Δᵀ U`,
`Uᵀ Δ V`) and its squared Frobenius norm; with `B [d_out, r]`, `A [r, d_in]` each costs
`O((d_out + d_in) r R)` instead of the `d_out × d_in` dense matrix per adapter. Everything
is float64: fitting is offline and its reference checks are exact to ~1e-12.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.collections.errors import CollectionError


@dataclass(frozen=True)
class FactoredDelta:
    """`ΔW = b @ a`, the semantic scale already folded into `b` (float64)."""

    b: torch.Tensor  # [d_out, r]
    a: torch.Tensor  # [r, d_in]

    @classmethod
    def of(cls, b: torch.Tensor, a: torch.Tensor, scale: float = 1.0) -> FactoredDelta:
        if b.dim() != 2 or a.dim() != 2 or b.shape[1] != a.shape[0]:
            raise CollectionError("factors must be B [d_out, r] and A [r, d_in]",
                                  b_shape=list(b.shape), a_shape=list(a.shape))
        b64 = b.detach().to(torch.float64) * float(scale)
        a64 = a.detach().to(torch.float64)
        if not bool(torch.isfinite(b64).all()) or not bool(torch.isfinite(a64).all()):
            raise CollectionError("factors must be finite")
        return cls(b64, a64)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.b.shape[0]), int(self.a.shape[1])

    def dense(self) -> torch.Tensor:
        return self.b @ self.a

    def frobenius_sq(self) -> float:
        """‖BA‖²_F = tr((BᵀB)(AAᵀ))."""
        return float(((self.b.T @ self.b) * (self.a @ self.a.T)).sum())

    def right(self, v: torch.Tensor) -> torch.Tensor:
        """Δ V: [d_out, R]."""
        return self.b @ (self.a @ v)

    def left(self, u: torch.Tensor) -> torch.Tensor:
        """Δᵀ U: [d_in, R]."""
        return self.a.T @ (self.b.T @ u)

    def project(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Uᵀ Δ V: [R_u, R_v]."""
        return (u.T @ self.b) @ (self.a @ v)

    def scaled(self, factor: float) -> FactoredDelta:
        return FactoredDelta(self.b * factor, self.a)


def check_collection(deltas: list[FactoredDelta], rank: int) -> tuple[int, int]:
    """Same shape for every member and `1 <= rank <= min(d_out, d_in)`; returns the shape."""
    if not deltas:
        raise CollectionError("a collection needs at least one adapter")
    shape = deltas[0].shape
    for i, delta in enumerate(deltas):
        if delta.shape != shape:
            raise CollectionError("every adapter of a module must have the same shape",
                                  index=i, shape=list(delta.shape), expected=list(shape))
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(shape):
        raise CollectionError(f"shared rank must be an integer in [1, {min(shape)}]",
                              rank=rank, shape=list(shape))
    return shape


def span_reduction(deltas: list[FactoredDelta], rank: int
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None, list[FactoredDelta]]:
    """Restate the collection in orthonormal bases of its own column and row spaces.

    Every `Δ_i V` lies in `span([B_1 … B_n])` and every `Δ_iᵀ U` in `span([A_1ᵀ … A_nᵀ])`,
    so the shared bases of both fits do too: with `Q_B`, `Q_A` orthonormal bases of those
    spans, fitting `Q_Bᵀ Δ_i Q_A` (size `n·r0` instead of `d`) and mapping back
    `U = Q_B U'`, `V = Q_A V'` solves the same problem. Returns `(Q_B | None, Q_A | None,
    deltas)`; a side is left as is (None) when its span is not smaller than `d` or is
    narrower than `rank`.
    """
    d_out, d_in = deltas[0].shape
    width = sum(int(d.b.shape[1]) for d in deltas)
    q_b = q_a = None
    if rank <= width < d_out:
        q_b, _ = torch.linalg.qr(torch.cat([d.b for d in deltas], dim=1))
    if rank <= width < d_in:
        q_a, _ = torch.linalg.qr(torch.cat([d.a.T for d in deltas], dim=1))
    if q_b is None and q_a is None:
        return None, None, deltas
    reduced = [FactoredDelta(d.b if q_b is None else q_b.T @ d.b,
                             d.a if q_a is None else d.a @ q_a) for d in deltas]
    return q_b, q_a, reduced
