"""Offline Compress-then-Serve conversion of one collection.

Freeze the ordered source set → validate every member against the base → fit bases and
cores (unit-norm updates, cores restored) → evaluate reconstruction → refuse release past
the threshold → emit the immutable bundle. The release gate is reconstruction only: the
relative Frobenius error of each member summed over its modules; a task-level evaluation
belongs to the user's own suite (the bundle's members can be written as PEFT adapters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from dataplane.artifacts import BaseModelABI
from dataplane.collections.bundle import CollectionBundle, build_bundle
from dataplane.collections.collection_fit import CollectionFit, fit_collection
from dataplane.collections.errors import CollectionError, ReleaseRefused
from dataplane.collections.jd_full import DEFAULT_ITERATIONS
from dataplane.collections.joint_fit import JD_FULL, METHODS
from dataplane.collections.sources import PeftSources

FIT_REVISION = 1
"""Bumped whenever the fitting algorithm changes what a spec produces."""


@dataclass(frozen=True)
class CompressionSpec:
    method: str = JD_FULL
    rank: int = 16
    clusters: int = 1
    iterations: int = DEFAULT_ITERATIONS
    rounds: int = 10
    seed: int = 0
    max_relative_error: Fraction = Fraction(1, 10)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise CollectionError(f"unknown method {self.method!r}", supported=list(METHODS))
        for name in ("rank", "clusters", "iterations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CollectionError(f"{name} must be a positive integer", **{name: value})
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 0:
            raise CollectionError("rounds must be a non-negative integer", rounds=self.rounds)
        if not 0 <= self.max_relative_error <= 1:
            raise CollectionError("max_relative_error must be in [0, 1]")

    def identity_record(self) -> dict[str, Any]:
        """The fit settings H_collection binds (no floats: the threshold is a fraction)."""
        return {"iterations": self.iterations, "rounds": self.rounds, "seed": self.seed,
                "normalization": "unit_frobenius", "fit_revision": FIT_REVISION,
                "max_relative_error": f"{self.max_relative_error.numerator}/"
                                      f"{self.max_relative_error.denominator}"}


def evaluate(fit: CollectionFit, ranks: dict[str, list[int]]) -> dict[str, Any]:
    """Per-member relative errors and the parameter ledger (`ranks`: module -> members'
    source ranks)."""
    n = len(fit.assignment)
    errors = [fit.relative_error(i) for i in range(n)]
    sizes = {name: int(fit.bases[0][name][0].shape[0] + fit.bases[0][name][1].shape[0])
             for name in fit.modules}
    lora = sum(r * sizes[name] for name in fit.modules for r in ranks[name])
    per_adapter = fit.rank * fit.rank if fit.method == JD_FULL else fit.rank
    joint = sum(fit.clusters * fit.rank * sizes[name] + n * per_adapter for name in fit.modules)
    return {
        "relative_error": errors, "max_relative_error": max(errors),
        "mean_relative_error": sum(errors) / n, "rounds": fit.rounds,
        "module_relative_error_max": {
            name: max((fit.residual_sq[i][name] / fit.energy[i][name]) ** 0.5
                      if fit.energy[i][name] > 0 else 0.0 for i in range(n))
            for name in fit.modules},
        "params": {"lora": lora, "joint": joint,
                   "joint_paper_ledger": joint + (n if fit.clusters > 1 else 0)},
    }


def compress_collection(directories: Sequence[Path], base: BaseModelABI, *,
                        sources_h_artifact: Sequence[str], spec: CompressionSpec
                        ) -> CollectionBundle:
    """Fit, evaluate and bundle; ReleaseRefused (with the metrics) past the threshold."""
    if len(directories) != len(sources_h_artifact):
        raise CollectionError("one H_artifact per member directory is required")
    sources = PeftSources(directories, base)
    for index, (found, recorded) in enumerate(
            zip(sources.h_artifacts, sources_h_artifact, strict=True)):
        if found != recorded:
            raise CollectionError("member bytes do not match their recorded H_artifact",
                                  index=index, h_artifact=recorded)
    fit = fit_collection(sources, method=spec.method, rank=spec.rank,
                         clusters=spec.clusters, iterations=spec.iterations,
                         rounds=spec.rounds, seed=spec.seed)
    metrics = evaluate(fit, {name: sources.ranks(name) for name in fit.modules})
    if Fraction(metrics["max_relative_error"]) > spec.max_relative_error:
        worst = max(range(len(fit.assignment)), key=lambda i: metrics["relative_error"][i])
        raise ReleaseRefused(
            f"member {worst} is reconstructed with relative error "
            f"{metrics['max_relative_error']:.4g} > {float(spec.max_relative_error):.4g}",
            worst=worst, metrics=metrics)
    return build_bundle(fit, h_base=base.h_base, sources=list(sources_h_artifact),
                        settings=spec.identity_record(), metrics=metrics)
