"""PEFT LoRA adapters in memory, and which adapter occupies which engine slot.

`load_peft_adapter` validates a PEFT directory against the base ABI with
`dataplane.artifacts.validate_peft_dir` (shapes, ranks, dtypes, finiteness, the exact
scaling rule and per-module rank/alpha from `rank_pattern` / `alpha_pattern`), then reads
the factors `A [r, d_in]`, `B [d_out, r]` as stored by PEFT and takes each module's scale
from its `ModuleSpec` (alpha / r, or alpha / sqrt(r) for rsLoRA). The adapter's identity is
its semantic digest `H_adapter_semantic(H_base, H_artifact)` — what the prefix cache keys on.

`AdapterRegistry` binds handles to slots; the factors themselves are placed by the slot's
owner (the engine's unified pool, dataplane/engine/pool_slots.py, which under tensor
parallelism holds the rank's shard; a collection member's core in the collection tables).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open

from dataplane.artifacts import (
    WEIGHTS_FILE,
    ArtifactLimits,
    ArtifactRejected,
    BaseModelABI,
    canonical_module_name,
    validate_peft_dir,
)
from dataplane.core import EngineError, Sequence
from dataplane.engine.kernel_identity import PAGED, single_device_kernel_local
from dataplane.identity import ModuleSpec
from dataplane.layers.lora_linear import LoRALinear
from dataplane.models.config import ModelConfig
from dataplane.models.llama import LORA_GROUPS

_MODULE = re.compile(
    r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$")


ADAPTABLE_MODULES = frozenset(m for names in LORA_GROUPS.values() for m in names)
"""Every PEFT module name a LoRA adapter may target (q/k/v/o and gate/up/down)."""


def projection_of(name: str) -> tuple[int, str] | None:
    """``(layer, module)`` of a canonical module name such as
    ``model.layers.3.self_attn.q_proj``; None for anything that is not a projection."""
    match = _MODULE.match(name)
    return None if match is None else (int(match.group(1)), match.group(2))


class AdapterError(EngineError):
    """The adapter is invalid for this engine (rejected artifact, no slot, rank too big)."""

    code = "ADAPTER_INVALID"


class Placed(Protocol):
    """What H_kernel_local records of an adapter placed in a slot (a `LoadedAdapter`)."""

    @property
    def digest(self) -> str: ...

    @property
    def specs(self) -> SequenceOf[ModuleSpec]: ...


class ModelRunnerLike(Protocol):
    """What the registry needs from the ModelRunner (avoids an import cycle)."""

    config: ModelConfig
    max_slots: int
    max_rank: int
    linears: dict[tuple[int, str], LoRALinear]


@dataclass(frozen=True)
class ModuleFactors:
    """One adapted projection: layer, PEFT module name, factors and semantic scale."""

    layer: int
    module: str
    a: torch.Tensor  # [r, d_in]
    b: torch.Tensor  # [d_out, r]
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True)
class LoadedAdapter:
    """All factors of one adapter plus its semantic digest (64 hex) and, when read from a
    validated artifact, its per-module specs (what H_kernel_local records, sorted by name).
    """

    modules: tuple[ModuleFactors, ...]
    digest: str
    source: str = ""
    specs: tuple[ModuleSpec, ...] = ()
    invocation_tokens: tuple[int, ...] | None = None
    """An activated LoRA's invocation token ids (None: always on)."""

    @property
    def max_rank(self) -> int:
        return max((m.rank for m in self.modules), default=0)


def load_peft_adapter(peft_dir: Path, base: BaseModelABI, max_rank: int) -> LoadedAdapter:
    """Validate and read a PEFT LoRA directory (AdapterError on rejection)."""
    peft_dir = Path(peft_dir)
    try:
        artifact = validate_peft_dir(peft_dir, base, ArtifactLimits(max_rank=max_rank))
    except ArtifactRejected as exc:
        raise AdapterError(f"adapter rejected: {exc.message}", rejection=exc.code.value,
                           **exc.detail) from exc
    specs = {m.name: m for m in artifact.modules}
    tensors: dict[tuple[str, str], torch.Tensor] = {}
    with safe_open(str(peft_dir / WEIGHTS_FILE), framework="pt", device="cpu") as handle:
        for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
            parsed = canonical_module_name(key)
            if parsed is not None and parsed[0] in specs:
                tensors[parsed] = handle.get_tensor(key)
    modules = []
    for name, spec in sorted(specs.items()):
        where = projection_of(name)
        if where is None:
            raise AdapterError(f"module {name!r} is not a supported projection", module=name)
        a, b = tensors[(name, "A")], tensors[(name, "B")]
        modules.append(ModuleFactors(where[0], where[1], a, b, spec.scale))
    return LoadedAdapter(tuple(modules), artifact.h_adapter_semantic, str(peft_dir),
                         tuple(sorted(artifact.modules, key=lambda m: m.name)),
                         artifact.invocation_tokens)


@dataclass(frozen=True)
class AdapterHandle:
    """A registered adapter: its slot, semantic digest and the slot's load generation;
    an activated LoRA also has its invocation token ids (engine/activation.py)."""

    slot: int
    digest: str
    slot_generation: int
    max_rank: int
    source: str
    invocation_tokens: tuple[int, ...] | None = None


@functools.lru_cache(maxsize=1024)
def _kernel_local_digest(semantic: str, specs: tuple[ModuleSpec, ...], family: str, dtype: str,
                         packing: str) -> str:
    return single_device_kernel_local(adapter_semantic=semantic, specs=specs,
                                      kernel_family=family, dtype=dtype,
                                      packing=packing).h_kernel_local


class AdapterRegistry:
    """Which adapter handle is bound to which slot of one engine.

    A handle is valid while its slot is still bound to it (same slot generation); the
    scheduler's readiness predicate and `add_request` check handles here.
    """

    def __init__(self, runner: ModelRunnerLike) -> None:
        self.runner = runner
        self._by_slot: dict[int, AdapterHandle] = {}
        self._generations: dict[int, int] = {}
        self._kernel_local: dict[int, tuple[str, ...]] = {}
        self._placed: dict[int, tuple[str, tuple[ModuleSpec, ...], str, str | None]] = {}
        """Slot -> (semantic digest, module specs, packing, kernel family if not the
        engine's LoRA kernels) whose H_kernel_local is not
        computed yet: a load only notes it (hashing 224 module layouts costs milliseconds,
        more than a cold load's whole budget); `kernel_local` computes it when read."""

    @property
    def kernel_local(self) -> dict[int, tuple[str, ...]]:
        """Bound slot -> its H_kernel_local (one digest here; one per rank under TP), for
        adapters read from a validated artifact (those carry their module specs)."""
        if self._placed:
            dtype = str(getattr(self.runner, "dtype", "torch.float32")).split(".")[-1]
            family = self.kernel_family
            for slot, (semantic, specs, packing, own) in self._placed.items():
                self._kernel_local[slot] = (
                    _kernel_local_digest(semantic, specs, own or family, dtype, packing),)
            self._placed.clear()
        return self._kernel_local

    @property
    def kernel_family(self) -> str:
        """The kernels that read this engine's slots: the LoRA backend, `+fold` when decode
        steps fold the LoRA into the base GEMMs."""
        backend = getattr(self.runner, "backend", None)
        model = getattr(self.runner, "model", None)
        fold = "+fold" if getattr(model, "lora_fold_slots", None) is not None else ""
        return (backend.name if backend is not None else "none") + fold

    def set_kernel_local(self, slot: int, digests: tuple[str, ...]) -> None:
        """Record a bound slot's H_kernel_local computed by its owner (one per rank: the
        TP leader, from the ranks' publication votes)."""
        self._placed.pop(slot, None)
        self._kernel_local[slot] = digests

    def _note_placement(self, slot: int, adapter: Placed | None, packing: str,
                        family: str | None = None) -> None:
        self._kernel_local.pop(slot, None)
        self._placed.pop(slot, None)
        if adapter is not None and adapter.specs:
            self._placed[slot] = (adapter.digest, tuple(adapter.specs), packing, family)

    def free_slots(self) -> list[int]:
        """Slots no handle is bound to, in order."""
        return [s for s in range(self.runner.max_slots) if s not in self._by_slot]

    def next_generation(self, slot: int) -> int:
        """Count one more load of `slot` (for a handle its owner binds with :meth:`bind`)."""
        self._generations[slot] = self._generations.get(slot, 0) + 1
        return self._generations[slot]

    def check_fits(self, adapter: LoadedAdapter) -> None:
        """AdapterError unless every module of `adapter` fits this model and rank limit."""
        if self.runner.max_slots == 0:
            raise AdapterError("this engine has LoRA disabled (max_slots=0)")
        shapes = self.runner.config.module_shapes
        for m in adapter.modules:
            if m.rank > self.runner.max_rank:
                raise AdapterError(f"adapter rank {m.rank} exceeds max_rank "
                                   f"{self.runner.max_rank}", rank=m.rank)
            if m.module not in shapes:
                raise AdapterError(f"{m.module!r} is not a LoRA projection", module=m.module)
            d_out, d_in = shapes[m.module]
            if not 0 <= m.layer < self.runner.config.num_layers or \
                    tuple(m.a.shape) != (m.rank, d_in) or tuple(m.b.shape) != (d_out, m.rank):
                raise AdapterError(f"layer {m.layer} {m.module}: factors do not fit the model")

    def bind(self, handle: AdapterHandle, adapter: Placed | None = None,
             packing: str = PAGED, family: str | None = None) -> None:
        """Bind `handle` to its slot, whose factors its owner has placed (the unified
        pool's address tables, a collection member's core in the collection tables).

        The slot must be free and within `max_slots`.
        `adapter` (its digest and module specs), `packing` and `family` (None: the engine's
        LoRA kernels) are what the slot's H_kernel_local records.
        After this, `add_request(adapter=handle)` and the scheduler's readiness check
        accept the handle.
        """
        if not 0 <= handle.slot < self.runner.max_slots:
            raise AdapterError("slot outside the engine's slots", slot=handle.slot,
                               max_slots=self.runner.max_slots)
        if handle.slot in self._by_slot:
            raise AdapterError("slot is already bound", slot=handle.slot)
        self._by_slot[handle.slot] = handle
        self._note_placement(handle.slot, adapter, packing, family)

    def release(self, handle: AdapterHandle) -> None:
        """Undo :meth:`bind` (the caller fences requests that still use it)."""
        self.check_handle(handle)
        del self._by_slot[handle.slot]
        self._note_placement(handle.slot, None, PAGED)

    def bound(self) -> dict[int, AdapterHandle]:
        """Slot -> the handle bound there (a copy)."""
        return dict(self._by_slot)

    def check_handle(self, handle: AdapterHandle) -> None:
        if self._by_slot.get(handle.slot) != handle:
            raise AdapterError("adapter handle is not registered (stale or foreign)",
                               slot=handle.slot)

    def is_ready(self, seq: Sequence) -> bool:
        """Scheduler predicate (engine/readiness.py): base rows, or the request's slot is
        bound (a handle is bound only once its copy is published) to the adapter the
        request leased. The adapter generation is content-addressed, its semantic digest:
        a slot reused by another adapter never serves the request; the same adapter
        reloaded there (a new slot generation, the same digest) does."""
        if seq.adapter_slot < 0:
            return True
        handle = self._by_slot.get(seq.adapter_slot)
        return handle is not None and handle.digest == seq.adapter_digest
