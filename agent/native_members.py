"""Collection members served natively by an agent (`collection_blocks` > 0).

An alias names an artifact; when that artifact materialises a member of a fitted
collection (desired state's `artifact.collection`), an agent with collection blocks can
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

import torch

from dataplane.collections.bundle import MANIFEST_FILE, TENSORS_FILE, CollectionBundle
from dataplane.engine.adapters import LoadedAdapter, projection_of

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
