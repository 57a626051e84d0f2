"""Read a collection's member adapters as per-module factored updates.

Each member is a PEFT LoRA directory, validated against the base ABI exactly as the engine
loads it (`load_peft_adapter`); the update `s · B A` of every adapted module becomes a
`FactoredDelta` keyed by the canonical module name. All members must adapt the same
modules (their ranks may differ): a shared basis replaces one module shape at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dataplane.artifacts import BaseModelABI
from dataplane.collections.errors import CollectionError
from dataplane.collections.factored import FactoredDelta
from dataplane.engine.adapters import load_peft_adapter


@dataclass(frozen=True)
class CollectionSources:
    modules: dict[str, list[FactoredDelta]]
    ranks: dict[str, list[int]]
    semantic_digests: list[str]


def load_sources(directories: Sequence[Path], base: BaseModelABI,
                 max_rank: int = 1024) -> CollectionSources:
    modules: dict[str, list[FactoredDelta]] = {}
    ranks: dict[str, list[int]] = {}
    digests: list[str] = []
    expected: tuple[str, ...] | None = None
    for index, directory in enumerate(directories):
        adapter = load_peft_adapter(Path(directory), base, max_rank)
        names = tuple(spec.name for spec in adapter.specs)
        if expected is None:
            expected = names
        elif names != expected:
            raise CollectionError(
                "members must adapt the same modules", index=index,
                missing=sorted(set(expected) - set(names))[:8],
                extra=sorted(set(names) - set(expected))[:8])
        for spec, factors in zip(adapter.specs, adapter.modules, strict=True):
            modules.setdefault(spec.name, []).append(
                FactoredDelta.of(factors.b, factors.a, factors.scale))
            ranks.setdefault(spec.name, []).append(factors.rank)
        digests.append(adapter.digest)
    if expected is None:
        raise CollectionError("a collection needs at least one adapter")
    return CollectionSources(modules, ranks, digests)
