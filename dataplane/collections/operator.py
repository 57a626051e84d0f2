"""The runtime operator of a compressed collection, reference torch path.

For row-major tokens `X [N, d_in]` and adapter i: `X ΔW_iᵀ ≈ ((X V) Σ_iᵀ) Uᵀ`:

    X:[N, d_in] -> X V:[N, R]          one projection shape per cluster
                -> core Σ_i:[N, R]     per adapter: [R, R] matmul (JD-Full) or elementwise (JD-Diag)
                -> shared Uᵀ:[N, d_out] one projection shape per cluster

Rows are grouped by cluster for the two shared stages; a row whose core index is -1 gets
an exact zero delta (it names no adapter of this collection).
"""

from __future__ import annotations

import torch

from dataplane.collections.errors import CollectionError


def joint_delta(x: torch.Tensor, row_core: torch.Tensor, core_cluster: torch.Tensor,
                v: torch.Tensor, cores: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`x [N, d_in]`; `row_core [N]` core index per row (-1: none); `core_cluster [n]`
    cluster of each core; `v [k, d_in, R]`, `u [k, d_out, R]` per-cluster bases; `cores`
    `[n, R, R]` (JD-Full) or `[n, R]` (JD-Diag). Returns `[N, d_out]` in x's dtype."""
    n_rows, d_in = x.shape
    clusters, d_out, rank = u.shape
    if v.shape != (clusters, d_in, rank) or row_core.shape != (n_rows,):
        raise CollectionError("joint operator shapes disagree", x=list(x.shape),
                              v=list(v.shape), u=list(u.shape), row_core=list(row_core.shape))
    if cores.dim() not in (2, 3) or cores.shape[1:] not in ((rank, rank), (rank,)):
        raise CollectionError("cores must be [n, R, R] or [n, R]", cores=list(cores.shape))
    n_cores = cores.shape[0]
    if core_cluster.shape != (n_cores,):
        raise CollectionError("core_cluster must give one cluster per core")
    if n_rows and (int(row_core.max()) >= n_cores or int(row_core.min()) < -1):
        raise CollectionError("row core index out of range", cores=n_cores)
    out = torch.zeros(n_rows, d_out, dtype=x.dtype, device=x.device)
    live = row_core >= 0
    if not bool(live.any()):
        return out
    safe = torch.where(live, row_core, torch.zeros_like(row_core))
    row_cluster = torch.where(live, core_cluster[safe], torch.full_like(safe, -1))
    for c in torch.unique(row_cluster[live]).tolist():
        rows = (row_cluster == c).nonzero(as_tuple=True)[0]
        xv = x[rows].to(v.dtype) @ v[c]  # [m, R]
        core = cores[row_core[rows]]
        mid = (xv * core) if cores.dim() == 2 else torch.bmm(
            xv.unsqueeze(1), core.transpose(1, 2)).squeeze(1)
        out[rows] = (mid @ u[c].T).to(x.dtype)
    return out
