"""Fit a whole adapter collection: every module, one cluster assignment per adapter.

Follows seed §0x06G5–G6. Each update is normalised to unit Frobenius norm before fitting
(so every adapter weighs the same) and its cores are scaled back afterwards. With `k > 1`
clusters the assignment is shared by all modules of an adapter (the scheduler groups rows
by cluster once, not per module):

1. fit one basis per module over all adapters; k-means (k-means++ seeding from `seed`) on
   each adapter's concatenated normalised cores gives the first assignment;
2. fit step: refit each cluster's bases per module from its members only;
3. assignment step: move each adapter to the cluster whose bases reconstruct it best
   (summed over modules, each with its optimal core);
4. stop when no assignment changes or after `rounds` rounds. A cluster left empty is
   reseeded with the worst-reconstructed adapter.

A zero update (e.g. a fresh LoRA with `B = 0`) is kept as is: its optimal core is zero
and it is reconstructed exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dataplane.collections.errors import CollectionError
from dataplane.collections.factored import FactoredDelta, check_collection, span_reduction
from dataplane.collections.jd_diag import fit_jd_diag
from dataplane.collections.jd_full import DEFAULT_ITERATIONS, fit_jd_full
from dataplane.collections.joint_fit import (
    JD_DIAG,
    JD_FULL,
    METHODS,
    JointFit,
    optimal_diag_core,
    optimal_full_core,
    residual_sq,
)

DEFAULT_ROUNDS = 10
KMEANS_STEPS = 50


@dataclass(frozen=True)
class CollectionFit:
    """Per cluster `(U, V)` per module; per adapter its restored core per module."""

    method: str
    rank: int
    modules: tuple[str, ...]
    assignment: tuple[int, ...]
    bases: tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], ...]
    cores: tuple[dict[str, torch.Tensor], ...]
    residual_sq: tuple[dict[str, float], ...]
    energy: tuple[dict[str, float], ...]
    rounds: int

    @property
    def clusters(self) -> int:
        return len(self.bases)

    def relative_error(self, index: int) -> float:
        """sqrt(Σ_m ‖Δ_m − U Σ Vᵀ‖² / Σ_m ‖Δ_m‖²) for one adapter (0 for a zero update)."""
        energy = sum(self.energy[index].values())
        residual = sum(self.residual_sq[index].values())
        return math.sqrt(residual / energy) if energy > 0 else 0.0


def _fit(method: str, deltas: list[FactoredDelta], rank: int, iterations: int) -> JointFit:
    """Fit in the collection's own column/row spans (`span_reduction`), then map back."""
    q_b, q_a, small = span_reduction(deltas, rank)
    if method == JD_FULL:
        fit = fit_jd_full(small, rank, iterations=iterations)
    else:
        fit = fit_jd_diag(small, rank, iterations=iterations)
    u = fit.u if q_b is None else q_b @ fit.u
    v = fit.v if q_a is None else q_a @ fit.v
    return JointFit(fit.method, u, v, fit.cores, fit.objective)


def _optimal_core(method: str, delta: FactoredDelta, u: torch.Tensor,
                  v: torch.Tensor) -> torch.Tensor:
    if method == JD_FULL:
        return optimal_full_core(delta, u, v)
    return optimal_diag_core(delta, u, v)


def _square(method: str, core: torch.Tensor) -> torch.Tensor:
    return torch.diag(core) if method == JD_DIAG else core


def _normalise(modules: Mapping[str, list[FactoredDelta]]
               ) -> tuple[dict[str, list[FactoredDelta]], dict[str, list[float]]]:
    normalised: dict[str, list[FactoredDelta]] = {}
    norms: dict[str, list[float]] = {}
    for name, deltas in modules.items():
        norms[name] = [math.sqrt(d.frobenius_sq()) for d in deltas]
        normalised[name] = [d.scaled(1.0 / n) if n > 0 else d
                            for d, n in zip(deltas, norms[name], strict=True)]
    return normalised, norms


def _kmeans(points: torch.Tensor, k: int, seed: int) -> list[int]:
    """Lloyd's k-means with k-means++ seeding; deterministic for a seed."""
    generator = torch.Generator().manual_seed(seed)
    first = int(torch.randint(points.shape[0], (1,), generator=generator))
    centres = [points[first]]
    for _ in range(1, k):
        dist = torch.cdist(points, torch.stack(centres)).min(dim=1).values ** 2
        if float(dist.sum()) <= 0:
            pick = len(centres)  # all points coincide with a centre: any distinct index
        else:
            pick = int(torch.multinomial(dist / dist.sum(), 1, generator=generator))
        centres.append(points[pick])
    centre = torch.stack(centres)
    labels = torch.cdist(points, centre).argmin(dim=1)
    for _ in range(KMEANS_STEPS):
        for c in range(k):
            members = labels == c
            if bool(members.any()):
                centre[c] = points[members].mean(dim=0)
        new = torch.cdist(points, centre).argmin(dim=1)
        if bool((new == labels).all()):
            break
        labels = new
    return [int(x) for x in labels]


def _fit_clusters(method: str, normalised: dict[str, list[FactoredDelta]], rank: int,
                  iterations: int, assignment: list[int], k: int
                  ) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    bases: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    for c in range(k):
        members = [i for i, a in enumerate(assignment) if a == c]
        bases.append({name: (fit.u, fit.v) for name, deltas in normalised.items()
                      for fit in [_fit(method, [deltas[i] for i in members], rank,
                                       iterations)]})
    return bases


def _errors(method: str, normalised: dict[str, list[FactoredDelta]],
            bases: list[dict[str, tuple[torch.Tensor, torch.Tensor]]], n: int) -> torch.Tensor:
    """[n, k] summed normalised squared residual of adapter i under cluster c's bases."""
    errors = torch.zeros(n, len(bases), dtype=torch.float64)
    for c, cluster in enumerate(bases):
        for name, deltas in normalised.items():
            u, v = cluster[name]
            for i, delta in enumerate(deltas):
                core = _square(method, _optimal_core(method, delta, u, v))
                errors[i, c] += residual_sq(delta, u, v, core)
    return errors


def _reseed_empty(assignment: list[int], errors: torch.Tensor, k: int) -> list[int]:
    assignment = list(assignment)
    for c in range(k):
        if c in assignment:
            continue
        own = errors[torch.arange(len(assignment)), torch.tensor(assignment)]
        sizes = [assignment.count(a) for a in assignment]
        movable = [i for i in range(len(assignment)) if sizes[i] > 1]
        worst = max(movable, key=lambda i: (float(own[i]), -i))
        assignment[worst] = c
    return assignment


def fit_collection(modules: Mapping[str, list[FactoredDelta]], *, method: str, rank: int,
                   clusters: int = 1, iterations: int = DEFAULT_ITERATIONS,
                   rounds: int = DEFAULT_ROUNDS, seed: int = 0) -> CollectionFit:
    """`modules`: module name -> the n adapters' updates, in the collection's order."""
    if method not in METHODS:
        raise CollectionError(f"unknown method {method!r}", method=method,
                              supported=list(METHODS))
    if not modules:
        raise CollectionError("a collection needs at least one adapted module")
    counts = {len(deltas) for deltas in modules.values()}
    if len(counts) != 1:
        raise CollectionError("every module must list the same adapters")
    n = counts.pop()
    for deltas in modules.values():
        check_collection(deltas, rank)
    if isinstance(clusters, bool) or not isinstance(clusters, int) or not 1 <= clusters <= n:
        raise CollectionError(f"clusters must be an integer in [1, {n}]", clusters=clusters)
    names = tuple(sorted(modules))
    normalised, norms = _normalise(modules)
    assignment = [0] * n
    done = 0
    if clusters > 1:
        first = {name: _fit(method, normalised[name], rank, iterations) for name in names}
        features = torch.cat([first[name].cores.reshape(n, -1) for name in names], dim=1)
        assignment = _kmeans(features, clusters, seed)
        assignment = _reseed_empty(assignment, torch.zeros(n, clusters,
                                                           dtype=torch.float64), clusters)
    bases = _fit_clusters(method, normalised, rank, iterations, assignment, clusters)
    while clusters > 1 and done < rounds:
        done += 1
        errors = _errors(method, normalised, bases, n)
        moved = _reseed_empty([int(c) for c in errors.argmin(dim=1)], errors, clusters)
        if moved == assignment:
            break
        assignment = moved
        bases = _fit_clusters(method, normalised, rank, iterations, assignment, clusters)
    return _restore(method, rank, names, modules, norms, assignment, bases, done)


def _restore(method: str, rank: int, names: tuple[str, ...],
             modules: Mapping[str, list[FactoredDelta]], norms: dict[str, list[float]],
             assignment: list[int], bases: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
             rounds: int) -> CollectionFit:
    n = len(assignment)
    cores: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    residuals: list[dict[str, float]] = [{} for _ in range(n)]
    energy: list[dict[str, float]] = [{} for _ in range(n)]
    for name in names:
        for i, delta in enumerate(modules[name]):
            u, v = bases[assignment[i]][name]
            norm = norms[name][i]
            unit = delta.scaled(1.0 / norm) if norm > 0 else delta
            core = _optimal_core(method, unit, u, v) * (norm if norm > 0 else 1.0)
            cores[i][name] = core
            residuals[i][name] = residual_sq(delta, u, v, _square(method, core))
            energy[i][name] = delta.frobenius_sq()
    return CollectionFit(method, rank, names, tuple(assignment), tuple(bases), tuple(cores),
                         tuple(residuals), tuple(energy), rounds)
