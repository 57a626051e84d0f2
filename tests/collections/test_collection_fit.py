"""Collection fitting on random collections, checked against dense float64 references."""

from __future__ import annotations

import pytest
import torch

from dataplane.collections import (
    JD_DIAG,
    JD_FULL,
    CollectionError,
    FactoredDelta,
    fit_collection,
    fit_jd_full,
    joint_delta,
)


def _orthonormal(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(rows, cols, dtype=torch.float64, generator=gen))
    return q


def _in_basis(u: torch.Tensor, v: torch.Tensor, gen: torch.Generator,
              r0: int) -> FactoredDelta:
    """An adapter of rank r0 whose update lies in span(U) x span(V)."""
    rank = u.shape[1]
    b = u @ torch.randn(rank, r0, dtype=torch.float64, generator=gen)
    a = torch.randn(r0, rank, dtype=torch.float64, generator=gen) @ v.T
    return FactoredDelta.of(b, a, scale=0.5)


def _random(d_out: int, d_in: int, r0: int, gen: torch.Generator) -> FactoredDelta:
    return FactoredDelta.of(torch.randn(d_out, r0, dtype=torch.float64, generator=gen),
                            torch.randn(r0, d_in, dtype=torch.float64, generator=gen))


def _dense_residual(delta: FactoredDelta, u: torch.Tensor, core: torch.Tensor,
                    v: torch.Tensor) -> float:
    return float(((delta.dense() - u @ core @ v.T) ** 2).sum())


@pytest.mark.parametrize("method", [JD_FULL, JD_DIAG])
def test_residuals_match_dense_reference_and_never_increase(method: str) -> None:
    gen = torch.Generator().manual_seed(1)
    deltas = [_random(24, 20, 4, gen) for _ in range(6)]
    fit = fit_collection({"m": deltas}, method=method, rank=6)
    u, v = fit.bases[0]["m"]
    for i, delta in enumerate(deltas):
        core = fit.cores[i]["m"]
        square = torch.diag(core) if method == JD_DIAG else core
        assert fit.residual_sq[i]["m"] == pytest.approx(
            _dense_residual(delta, u, square, v), rel=1e-9, abs=1e-9)
        assert fit.energy[i]["m"] == pytest.approx(float((delta.dense() ** 2).sum()), rel=1e-12)
    lossy = fit_jd_full(deltas, 6, iterations=30)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(lossy.objective, lossy.objective[1:],
                                                    strict=False))


def test_jd_full_core_is_the_projection_optimum() -> None:
    """No perturbation of the fitted core lowers the dense residual (Σ* = UᵀΔV)."""
    gen = torch.Generator().manual_seed(2)
    deltas = [_random(16, 12, 3, gen) for _ in range(4)]
    fit = fit_jd_full(deltas, 5)
    base = _dense_residual(deltas[0], fit.u, fit.core(0), fit.v)
    for _ in range(5):
        bumped = fit.core(0) + 1e-3 * torch.randn(5, 5, dtype=torch.float64, generator=gen)
        assert _dense_residual(deltas[0], fit.u, bumped, fit.v) > base


def test_shared_subspace_collection_is_lossless_at_its_rank() -> None:
    gen = torch.Generator().manual_seed(3)
    u0, v0 = _orthonormal(40, 6, gen), _orthonormal(32, 6, gen)
    deltas = [_in_basis(u0, v0, gen, r0=2) for _ in range(8)]
    fit = fit_collection({"q": deltas}, method=JD_FULL, rank=6)
    assert max(fit.relative_error(i) for i in range(8)) < 1e-6
    below = fit_collection({"q": deltas}, method=JD_FULL, rank=3)
    assert min(below.relative_error(i) for i in range(8)) > 1e-3


def test_clusters_separate_adapters_from_two_subspaces() -> None:
    gen = torch.Generator().manual_seed(4)
    groups = [(_orthonormal(30, 4, gen), _orthonormal(28, 4, gen)) for _ in range(2)]
    order = [0, 1, 1, 0, 1, 0, 0, 1]
    modules = {
        "x": [_in_basis(*groups[g], gen, r0=2) for g in order],
        "y": [_in_basis(groups[g][0], groups[g][0], gen, r0=2)
              for g in order],  # square 30 x 30 module, same grouping
    }
    one = fit_collection(modules, method=JD_FULL, rank=4, clusters=1)
    two = fit_collection(modules, method=JD_FULL, rank=4, clusters=2, seed=7)
    assert min(one.relative_error(i) for i in range(8)) > 1e-2
    assert max(two.relative_error(i) for i in range(8)) < 1e-6
    first = two.assignment[0]
    assert [a == first for a in two.assignment] == [g == order[0] for g in order]


def test_zero_update_is_kept_exact() -> None:
    gen = torch.Generator().manual_seed(5)
    zero = FactoredDelta.of(torch.zeros(10, 2, dtype=torch.float64),
                            torch.randn(2, 9, dtype=torch.float64, generator=gen))
    fit = fit_collection({"m": [zero, _random(10, 9, 2, gen)]}, method=JD_FULL, rank=2)
    assert fit.relative_error(0) == 0.0
    assert float(fit.cores[0]["m"].abs().max()) == 0.0


@pytest.mark.parametrize("method", [JD_FULL, JD_DIAG])
def test_operator_equals_dense_reconstruction_per_row(method: str) -> None:
    gen = torch.Generator().manual_seed(6)
    order = [0, 1, 0, 1, 1]
    groups = [(_orthonormal(12, 3, gen), _orthonormal(10, 3, gen)) for _ in range(2)]
    deltas = [_in_basis(*groups[g], gen, r0=1) for g in order]
    fit = fit_collection({"m": deltas}, method=method, rank=3, clusters=2)
    u = torch.stack([fit.bases[c]["m"][0] for c in range(2)])
    v = torch.stack([fit.bases[c]["m"][1] for c in range(2)])
    cores = torch.stack([fit.cores[i]["m"] for i in range(5)])
    x = torch.randn(7, 10, dtype=torch.float64, generator=gen)
    rows = torch.tensor([4, -1, 0, 2, 1, 3, 0])
    out = joint_delta(x, rows, torch.tensor(fit.assignment), v, cores, u)
    for r, i in enumerate(rows.tolist()):
        if i < 0:
            assert torch.equal(out[r], torch.zeros(12, dtype=torch.float64))
            continue
        c = fit.assignment[i]
        core = torch.diag(cores[i]) if method == JD_DIAG else cores[i]
        expected = x[r] @ (fit.bases[c]["m"][0] @ core @ fit.bases[c]["m"][1].T).T
        assert torch.allclose(out[r], expected, atol=1e-12, rtol=1e-12)


def test_bad_requests_are_refused_with_codes() -> None:
    gen = torch.Generator().manual_seed(7)
    deltas = [_random(6, 5, 2, gen) for _ in range(3)]
    cases = [
        dict(modules={"m": deltas}, method="svd", rank=2),
        dict(modules={"m": deltas}, method=JD_FULL, rank=6),
        dict(modules={"m": deltas}, method=JD_FULL, rank=0),
        dict(modules={"m": deltas}, method=JD_FULL, rank=2, clusters=4),
        dict(modules={"m": [*deltas[:2], _random(6, 4, 2, gen)]}, method=JD_FULL, rank=2),
        dict(modules={"m": deltas, "n": deltas[:2]}, method=JD_FULL, rank=2),
        dict(modules={}, method=JD_FULL, rank=2),
    ]
    for case in cases:
        with pytest.raises(CollectionError) as info:
            fit_collection(case.pop("modules"), **case)  # type: ignore[arg-type]
        assert info.value.code == "COLLECTION_INVALID"
    with pytest.raises(CollectionError):
        FactoredDelta.of(torch.full((3, 2), float("nan")), torch.ones(2, 3))


class CountingSource:
    """A ModuleSource over fixed updates that counts how often each module is read."""

    def __init__(self, modules: dict[str, list[FactoredDelta]]) -> None:
        self.modules, self.loads = modules, dict.fromkeys(modules, 0)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.modules))

    @property
    def count(self) -> int:
        return len(next(iter(self.modules.values())))

    def load(self, name: str) -> list[FactoredDelta]:
        self.loads[name] += 1
        return self.modules[name]


@pytest.mark.parametrize("clusters", [1, 2])
def test_streamed_modules_fit_like_the_whole_collection(clusters: int) -> None:
    """Read one module at a time (a pass per round), the fit is the in-memory fit."""
    gen = torch.Generator().manual_seed(8)
    modules = {name: [_random(14, 11, 2, gen) for _ in range(5)] for name in ("a", "b", "c")}
    whole = fit_collection(modules, method=JD_FULL, rank=3, clusters=clusters, rounds=3)
    source = CountingSource(modules)
    streamed = fit_collection(source, method=JD_FULL, rank=3, clusters=clusters, rounds=3)
    assert streamed.assignment == whole.assignment
    for i in range(5):
        for name in modules:
            assert torch.equal(streamed.cores[i][name], whole.cores[i][name])
    # every read is a pass over all modules: fit, restore (+ k-means, moved rounds)
    reads = set(source.loads.values())
    assert len(reads) == 1
    assert reads.pop() == (2 if clusters == 1 else 3 + max(0, whole.rounds - 1))
