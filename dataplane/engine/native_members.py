"""Collection members served natively as adapters (`collection_blocks` > 0).

An adapter artifact may materialise a member of a fitted collection (the agent learns it
from the desired state's `artifact.collection`); an engine with collection blocks can
serve it from the collection's shared bases: the cluster's `U, V` resident once, the
member's core at its slot (dataplane/engine/collection_slots.py). It does so only after
checking that the artifact's own factors are what the bundle materialises for that
member — `A = Vᵀ` exactly and `B = U Σ_i` within the artifact dtype's rounding, scale 1,
the same modules — so the function served is the artifact's, whichever path computes it.
Anything else (no link, a bundle that does not verify, factors that differ) serves the
artifact as an ordinary LoRA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from dataplane.collections.bundle import MANIFEST_FILE, TENSORS_FILE, CollectionBundle
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter, projection_of
from dataplane.engine.collection_slots import CollectionHandle

if TYPE_CHECKING:
    from dataplane.engine.engine import Engine

BUNDLE_FILES = frozenset({MANIFEST_FILE, TENSORS_FILE})


@dataclass(frozen=True)
class NativeMember(LoadedAdapter):
    """An artifact's factors (kept for the ordinary path) plus the bundle and position
    that serve it natively."""

    bundle: CollectionBundle | None = field(default=None, compare=False)
    member: int = -1


def member_mismatch(bundle: CollectionBundle, index: int, adapter: LoadedAdapter
                    ) -> str | None:
    """Why `adapter` is not member `index` of `bundle` (None: it is)."""
    if not 0 <= index < len(bundle.assignment):
        return f"member {index} is outside the collection"
    names: dict[tuple[int, str], str] = {}
    for name in bundle.modules:
        where = projection_of(name)
        if where is None:
            return f"unsupported module {name!r}"
        names[where] = name
    factors = {(m.layer, m.module): m for m in adapter.modules}
    if set(factors) != set(names):
        return "the artifact adapts other modules than the collection"
    for key, m in factors.items():
        if m.scale != 1.0:
            return f"{names[key]}: scale {m.scale} is not 1"
        b_ref, a_ref = bundle.lora_factors(index, names[key])
        if not torch.equal(m.a, a_ref.to(m.a.dtype)):
            return f"{names[key]}: A is not the collection's Vᵀ"
        eps = torch.finfo(m.b.dtype).eps
        ref = b_ref.to(m.b.dtype).float()
        if m.b.shape != ref.shape or not torch.allclose(
                m.b.float(), ref, rtol=4 * eps, atol=4 * eps * float(ref.abs().max())):
            return f"{names[key]}: B is not the collection's U Σ_{index}"
    return None


class NativeSlots:
    """The members the engine's pool serves natively, by slot: each one a one-member
    `CollectionHandle` in the engine's collection tables."""

    def __init__(self) -> None:
        self.held: dict[int, CollectionHandle] = {}

    def load(self, engine: Engine, adapter: LoadedAdapter) -> AdapterHandle | None:
        """Serve `adapter` natively if it is a `NativeMember` with its bundle and the
        engine has collection tables; None: load it as an ordinary adapter."""
        if not (isinstance(adapter, NativeMember) and adapter.bundle is not None
                and engine.runner.collections):
            return None
        held = engine.load_collection(adapter.bundle, [adapter.member],
                                      {adapter.member: adapter})
        member = held.members[0]
        self.held[member.slot] = held
        return member

    def holds(self, handle: AdapterHandle) -> bool:
        held = self.held.get(handle.slot)
        return held is not None and held.members[0] == handle

    def unload(self, engine: Engine, handle: AdapterHandle) -> bool:
        """Unload `handle` if it is a native member (True), else leave it (False)."""
        if not self.holds(handle):
            return False
        engine.unload_collection(self.held.pop(handle.slot))
        return True

    def collection_of(self, slot: int) -> str | None:
        """H_collection of the collection serving `slot` natively, else None."""
        held = self.held.get(slot)
        return held.h_collection if held is not None else None
