"""A collection's members, read one module at a time.

Fitting a large collection must not hold every member's factors at once (128 rank-16
members of an 8B model are 10.7 GB of bf16 factors, four times that in float64). Members
are validated up front against the base ABI (`validate_peft_dir`: shapes, ranks, dtypes,
finiteness, the exact scaling rule), which streams their bytes; the fit then reads one
module's factors of every member at a time from the memory-mapped safetensors files.

`ModuleSource` is what `fit_collection` reads: module names, member count, and a loader of
one module's n updates. `InMemoryModules` wraps a ready dict (tests, small collections);
`PeftSources` reads PEFT directories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from safetensors import safe_open

from dataplane.artifacts import (
    WEIGHTS_FILE,
    ArtifactLimits,
    ArtifactRejected,
    BaseModelABI,
    canonical_module_name,
    validate_peft_dir,
)
from dataplane.collections.errors import CollectionError
from dataplane.collections.factored import FactoredDelta


class ModuleSource(Protocol):
    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def count(self) -> int: ...

    def load(self, name: str) -> list[FactoredDelta]: ...


@dataclass(frozen=True)
class InMemoryModules:
    modules: Mapping[str, list[FactoredDelta]]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.modules))

    @property
    def count(self) -> int:
        counts = {len(deltas) for deltas in self.modules.values()}
        if len(counts) != 1:
            raise CollectionError("every module must list the same adapters")
        return counts.pop()

    def load(self, name: str) -> list[FactoredDelta]:
        return self.modules[name]


@dataclass(frozen=True)
class MemberModule:
    """Where one member keeps one module: its safetensors keys and semantic scale."""

    a_key: str
    b_key: str
    rank: int
    scale: float


class PeftSources:
    """Validated PEFT members; `load(name)` reads that module of every member."""

    def __init__(self, directories: Sequence[Path], base: BaseModelABI,
                 max_rank: int = 1024) -> None:
        self.directories = [Path(d) for d in directories]
        self.h_artifacts: list[str] = []
        self.members: list[dict[str, MemberModule]] = []
        for index, directory in enumerate(self.directories):
            try:
                artifact = validate_peft_dir(directory, base, ArtifactLimits(max_rank=max_rank))
            except ArtifactRejected as exc:
                raise CollectionError(f"member {index} rejected: {exc.message}", index=index,
                                      rejection=exc.code.value) from exc
            if artifact.invocation_tokens is not None:  # members are served on every row
                raise CollectionError(f"member {index} is an activated LoRA: a collection's "
                                      "members are always on", index=index,
                                      rejection="alora_unsupported")
            keys: dict[str, dict[str, str]] = {}
            with safe_open(str(directory / WEIGHTS_FILE), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    parsed = canonical_module_name(key)
                    if parsed is not None:
                        keys.setdefault(parsed[0], {})[parsed[1]] = key
            self.members.append({
                spec.name: MemberModule(keys[spec.name]["A"], keys[spec.name]["B"],
                                        spec.rank, spec.scale)
                for spec in artifact.modules})
            self.h_artifacts.append(artifact.h_artifact)
        if not self.members:
            raise CollectionError("a collection needs at least one adapter")
        expected = set(self.members[0])
        for index, member in enumerate(self.members):
            if set(member) != expected:
                raise CollectionError(
                    "members must adapt the same modules", index=index,
                    missing=sorted(expected - set(member))[:8],
                    extra=sorted(set(member) - expected)[:8])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.members[0]))

    @property
    def count(self) -> int:
        return len(self.members)

    def ranks(self, name: str) -> list[int]:
        return [member[name].rank for member in self.members]

    def load(self, name: str) -> list[FactoredDelta]:
        deltas = []
        for directory, member in zip(self.directories, self.members, strict=True):
            where = member[name]
            with safe_open(str(directory / WEIGHTS_FILE), framework="pt") as handle:
                deltas.append(FactoredDelta.of(handle.get_tensor(where.b_key),
                                               handle.get_tensor(where.a_key), where.scale))
        return deltas
