"""A fitted shared basis for one module: `ΔW_i ≈ U Σ_i Vᵀ`.

`cores` is `[n, R, R]` (JD-Full) or `[n, R]` (JD-Diag, `Σ_i = diag(s_i)`). Residuals are
computed from factors, never from dense updates:

    ‖Δ − U Σ Vᵀ‖² = ‖Δ‖² − 2 tr(Σᵀ Uᵀ Δ V) + tr(Σᵀ (UᵀU) Σ (VᵀV)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.collections.factored import FactoredDelta

JD_FULL = "jd-full"
JD_DIAG = "jd-diag"
METHODS = (JD_FULL, JD_DIAG)


@dataclass(frozen=True)
class JointFit:
    method: str
    u: torch.Tensor  # [d_out, R]
    v: torch.Tensor  # [d_in, R]
    cores: torch.Tensor  # [n, R, R] or [n, R]
    objective: tuple[float, ...] = ()
    """Σ_i squared residual after each sweep (non-increasing)."""

    @property
    def rank(self) -> int:
        return int(self.u.shape[1])

    def core(self, index: int) -> torch.Tensor:
        """Σ_i as an [R, R] matrix."""
        core = self.cores[index]
        return torch.diag(core) if core.dim() == 1 else core

    def residual_sq(self, delta: FactoredDelta, index: int) -> float:
        return residual_sq(delta, self.u, self.v, self.core(index))

    def residuals_sq(self, deltas: list[FactoredDelta]) -> list[float]:
        return [self.residual_sq(d, i) for i, d in enumerate(deltas)]

    def with_cores(self, cores: torch.Tensor) -> JointFit:
        return JointFit(self.method, self.u, self.v, cores, self.objective)


def residual_sq(delta: FactoredDelta, u: torch.Tensor, v: torch.Tensor,
                core: torch.Tensor) -> float:
    """‖Δ − U Σ Vᵀ‖²_F (clamped at 0 against rounding)."""
    captured = float((core * delta.project(u, v)).sum())
    own = float(((core.T @ (u.T @ u) @ core) * (v.T @ v)).sum())
    return max(0.0, delta.frobenius_sq() - 2.0 * captured + own)


def optimal_full_core(delta: FactoredDelta, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Σ* = Uᵀ Δ V for orthonormal U, V."""
    return delta.project(u, v)


def optimal_diag_core(delta: FactoredDelta, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """argmin_s ‖Δ − U diag(s) Vᵀ‖²: ((UᵀU)∘(VᵀV)) s = diag(Uᵀ Δ V) (min-norm if singular)."""
    gram = (u.T @ u) * (v.T @ v)
    rhs = torch.diagonal(delta.project(u, v))
    return torch.linalg.pinv(gram, hermitian=True) @ rhs


def canonical_signs(basis: torch.Tensor) -> torch.Tensor:
    """Flip each column so its largest-magnitude entry is positive (a deterministic basis)."""
    rows = basis.abs().argmax(dim=0)
    signs = torch.sign(basis[rows, torch.arange(basis.shape[1])])
    signs[signs == 0] = 1.0
    return basis * signs
