"""Fit a whole adapter collection: every module, one cluster assignment per adapter.

Each update is normalised to unit Frobenius norm before fitting
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
and it is reconstructed exactly. Modules are read one at a time from a `ModuleSource`
(each fit/assign round is one pass over them), so memory holds one module's updates plus
the bases and cores.
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
from dataplane.collections.sources import InMemoryModules, ModuleSource

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


def _unit(deltas: list[FactoredDelta]) -> tuple[list[FactoredDelta], list[float]]:
    """Each update scaled to unit Frobenius norm (a zero update is left as is), and norms."""
    norms = [math.sqrt(d.frobenius_sq()) for d in deltas]
    return [d.scaled(1.0 / n) if n > 0 else d for d, n in zip(deltas, norms, strict=True)], norms


def _load(source: ModuleSource, name: str, n: int, rank: int) -> list[FactoredDelta]:
    deltas = source.load(name)
    if len(deltas) != n:
        raise CollectionError("every module must list the same adapters", module=name)
    check_collection(deltas, rank)
    return deltas


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


Bases = list[dict[str, tuple[torch.Tensor, torch.Tensor]]]


def _fit_pass(source: ModuleSource, method: str, rank: int, iterations: int,
              assignment: list[int], k: int, with_errors: bool
              ) -> tuple[Bases, torch.Tensor]:
    """One pass over the modules (one module's updates in memory at a time): each cluster's
    bases fitted from its members, and with `with_errors` the [n, k] summed normalised
    squared residual of adapter i under cluster c's bases (its optimal core each)."""
    n = len(assignment)
    bases: Bases = [{} for _ in range(k)]
    errors = torch.zeros(n, k, dtype=torch.float64)
    for name in source.names:
        unit, _ = _unit(_load(source, name, n, rank))
        for c in range(k):
            fit = _fit(method, [unit[i] for i in range(n) if assignment[i] == c], rank,
                       iterations)
            bases[c][name] = (fit.u, fit.v)
            if with_errors:
                for i, delta in enumerate(unit):
                    core = _square(method, _optimal_core(method, delta, fit.u, fit.v))
                    errors[i, c] += residual_sq(delta, fit.u, fit.v, core)
    return bases, errors


def _first_assignment(source: ModuleSource, method: str, rank: int, iterations: int, n: int,
                      k: int, seed: int) -> list[int]:
    """k-means on each adapter's concatenated normalised cores of a one-basis fit."""
    features = []
    for name in source.names:
        unit, _ = _unit(_load(source, name, n, rank))
        features.append(_fit(method, unit, rank, iterations).cores.reshape(n, -1))
    assignment = _kmeans(torch.cat(features, dim=1), k, seed)
    return _reseed_empty(assignment, torch.zeros(n, k, dtype=torch.float64), k)


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


def fit_collection(modules: Mapping[str, list[FactoredDelta]] | ModuleSource, *,
                   method: str, rank: int, clusters: int = 1,
                   iterations: int = DEFAULT_ITERATIONS, rounds: int = DEFAULT_ROUNDS,
                   seed: int = 0) -> CollectionFit:
    """`modules`: module name -> the n adapters' updates in the collection's order, or a
    `ModuleSource` that loads one module at a time (only one module's updates are held)."""
    source = InMemoryModules(modules) if isinstance(modules, Mapping) else modules
    if method not in METHODS:
        raise CollectionError(f"unknown method {method!r}", method=method,
                              supported=list(METHODS))
    if not source.names:
        raise CollectionError("a collection needs at least one adapted module")
    n = source.count
    if isinstance(clusters, bool) or not isinstance(clusters, int) or not 1 <= clusters <= n:
        raise CollectionError(f"clusters must be an integer in [1, {n}]", clusters=clusters)
    assignment = [0] * n
    if clusters > 1:
        assignment = _first_assignment(source, method, rank, iterations, n, clusters, seed)
    bases, errors = _fit_pass(source, method, rank, iterations, assignment, clusters,
                              with_errors=clusters > 1)
    done = 0
    while clusters > 1 and done < rounds:
        done += 1
        moved = _reseed_empty([int(c) for c in errors.argmin(dim=1)], errors, clusters)
        if moved == assignment:
            break
        assignment = moved
        bases, errors = _fit_pass(source, method, rank, iterations, assignment, clusters,
                                  with_errors=True)
    return _restore(source, method, rank, n, assignment, bases, done)


def _restore(source: ModuleSource, method: str, rank: int, n: int, assignment: list[int],
             bases: Bases, rounds: int) -> CollectionFit:
    """Each adapter's core for its cluster's bases, scaled back by its norm, per module."""
    cores: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    residuals: list[dict[str, float]] = [{} for _ in range(n)]
    energy: list[dict[str, float]] = [{} for _ in range(n)]
    for name in source.names:
        deltas = _load(source, name, n, rank)
        unit, norms = _unit(deltas)
        for i, delta in enumerate(deltas):
            u, v = bases[assignment[i]][name]
            core = _optimal_core(method, unit[i], u, v) * (norms[i] if norms[i] > 0 else 1.0)
            cores[i][name] = core
            residuals[i][name] = residual_sq(delta, u, v, _square(method, core))
            energy[i][name] = delta.frobenius_sq()
    return CollectionFit(method, rank, source.names, tuple(assignment), tuple(bases),
                         tuple(cores), tuple(residuals), tuple(energy), rounds)
