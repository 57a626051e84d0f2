"""JD-Full: orthonormal shared bases `U, V`, unconstrained cores.

For fixed orthonormal bases the best core is `Σ_i = Uᵀ Δ_i V`, so fitting maximises the
captured energy `Σ_i ‖Uᵀ Δ_i V‖²`. Alternate: `U` = top-R left singular vectors of
`[Δ_1 V, …, Δ_n V]` (the top eigenvectors of `M(V) = Σ Δ_i V Vᵀ Δ_iᵀ`), then `V` from
`[Δ_1ᵀ U, …]`. Each half-step is an exact maximiser, so the residual never increases.

`V` starts at the top-R eigenvectors of `Σ Δ_iᵀ Δ_i`: with `B_i = Q_i R_i`,
`Δ_iᵀ Δ_i = (R_i A_i)ᵀ (R_i A_i)`, the left singular vectors of `[A_iᵀ R_iᵀ]_i`.
"""

from __future__ import annotations

import torch

from dataplane.collections.factored import FactoredDelta, check_collection
from dataplane.collections.joint_fit import JD_FULL, JointFit, canonical_signs

DEFAULT_ITERATIONS = 10
"""The paper limits its alternating runs to ten iterations."""


def top_left_singular(blocks: list[torch.Tensor], rank: int) -> torch.Tensor:
    """The top-`rank` left singular vectors of `P = cat(blocks, dim=1)`, sign-canonical
    (for a wide `P`, the top eigenvectors of `P Pᵀ`: the same subspace, a smaller solve)."""
    stacked = torch.cat(blocks, dim=1)
    if stacked.shape[1] < rank:  # pad: the extra directions are arbitrary but orthonormal
        stacked = torch.cat(
            [stacked, torch.zeros(stacked.shape[0], rank - stacked.shape[1],
                                  dtype=stacked.dtype)], dim=1)
    if stacked.shape[1] > stacked.shape[0]:  # wide: the Gram matrix is the smaller problem
        _, vectors = torch.linalg.eigh(stacked @ stacked.T)
        return canonical_signs(vectors.flip(1)[:, :rank].contiguous())
    left, _, _ = torch.linalg.svd(stacked, full_matrices=False)
    return canonical_signs(left[:, :rank].contiguous())


def initial_v(deltas: list[FactoredDelta], rank: int) -> torch.Tensor:
    blocks = []
    for delta in deltas:
        _, r_factor = torch.linalg.qr(delta.b)
        blocks.append((r_factor @ delta.a).T)
    return top_left_singular(blocks, rank)


def captured(deltas: list[FactoredDelta], u: torch.Tensor, v: torch.Tensor) -> float:
    return sum(float((d.project(u, v) ** 2).sum()) for d in deltas)


def fit_jd_full(deltas: list[FactoredDelta], rank: int, *,
                iterations: int = DEFAULT_ITERATIONS, tolerance: float = 1e-12) -> JointFit:
    """Alternate `U`/`V` at most `iterations` sweeps; stop early once a sweep improves the
    residual by less than `tolerance` × ‖collection‖² (converged)."""
    check_collection(deltas, rank)
    total = sum(d.frobenius_sq() for d in deltas)
    v = initial_v(deltas, rank)
    u = top_left_singular([d.right(v) for d in deltas], rank)
    history: list[float] = []
    for _ in range(max(1, iterations)):
        u = top_left_singular([d.right(v) for d in deltas], rank)
        v = top_left_singular([d.left(u) for d in deltas], rank)
        history.append(max(0.0, total - captured(deltas, u, v)))
        if len(history) > 1 and history[-2] - history[-1] <= tolerance * max(total, 1e-300):
            break
    cores = torch.stack([d.project(u, v) for d in deltas])
    return JointFit(JD_FULL, u, v, cores, tuple(history))
