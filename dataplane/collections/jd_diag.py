"""JD-Diag: `ΔW_i ≈ U diag(s_i) Vᵀ = Σ_j s_ij u_j v_jᵀ`, unconstrained `U, V`.

Block coordinate descent over `U`, `V` and the diagonal cores `S [n, R]`; each block is an
exact least-squares minimiser, so the residual never increases:

    U ← (Σ_i Δ_i V diag(s_i)) · pinv((VᵀV) ∘ (SᵀS))
    V ← (Σ_i Δ_iᵀ U diag(s_i)) · pinv((UᵀU) ∘ (SᵀS))
    s_i ← pinv((UᵀU) ∘ (VᵀV)) · diag(Uᵀ Δ_i V)

After each sweep the columns of `U` and `V` are rescaled to unit norm and the scale moved
into `S` (the products are unchanged). Starts from a JD-Full fit's bases and the diagonals
of its cores.
"""

from __future__ import annotations

import torch

from dataplane.collections.factored import FactoredDelta, check_collection
from dataplane.collections.jd_full import DEFAULT_ITERATIONS, fit_jd_full
from dataplane.collections.joint_fit import JD_DIAG, JointFit, optimal_diag_core, residual_sq


def _objective(deltas: list[FactoredDelta], u: torch.Tensor, v: torch.Tensor,
               s: torch.Tensor) -> float:
    return sum(residual_sq(d, u, v, torch.diag(s[i])) for i, d in enumerate(deltas))


def _unit_columns(u: torch.Tensor, v: torch.Tensor,
                  s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    nu, nv = u.norm(dim=0), v.norm(dim=0)
    nu = torch.where(nu > 0, nu, torch.ones_like(nu))
    nv = torch.where(nv > 0, nv, torch.ones_like(nv))
    return u / nu, v / nv, s * (nu * nv)


def fit_jd_diag(deltas: list[FactoredDelta], rank: int, *,
                iterations: int = DEFAULT_ITERATIONS, tolerance: float = 1e-12,
                start: JointFit | None = None) -> JointFit:
    check_collection(deltas, rank)
    total = sum(d.frobenius_sq() for d in deltas)
    init = start if start is not None else fit_jd_full(deltas, rank, iterations=iterations)
    u, v = init.u.clone(), init.v.clone()
    s = torch.stack([optimal_diag_core(d, u, v) for d in deltas])
    history: list[float] = []
    for _ in range(max(1, iterations)):
        gram_s = s.T @ s
        rhs_u = sum((d.right(v) * s[i] for i, d in enumerate(deltas)), torch.zeros_like(u))
        u = rhs_u @ torch.linalg.pinv((v.T @ v) * gram_s, hermitian=True)
        rhs_v = sum((d.left(u) * s[i] for i, d in enumerate(deltas)), torch.zeros_like(v))
        v = rhs_v @ torch.linalg.pinv((u.T @ u) * gram_s, hermitian=True)
        s = torch.stack([optimal_diag_core(d, u, v) for d in deltas])
        u, v, s = _unit_columns(u, v, s)
        history.append(_objective(deltas, u, v, s))
        if len(history) > 1 and history[-2] - history[-1] <= tolerance * max(total, 1e-300):
            break
    return JointFit(JD_DIAG, u, v, s, tuple(history))
