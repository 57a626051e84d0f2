"""H_kernel_local of an adapter placed whole on one device (docs/ARCHITECTURE.md,
"Identities").

A one-GPU slot holds every module's factors unsharded, B stored transposed, in the
runner's factor tables ("stacked": one [slots, rank, width] table per fused projection)
or in the agent's unified page pool ("paged"). The record says which kernels may read
them: the kernel family (with `+fold` when decode steps fold the LoRA into the base
GEMMs), the conversion revision, dtype, packing, each module's (unsharded) layout and
TP shard 0 of 1. The TP ranks' counterpart is `dataplane.parallel.layout_identity`.
"""

from __future__ import annotations

from collections.abc import Sequence

from dataplane.identity import (
    A_AXES,
    B_STORED_AXES,
    KernelLocalIdentity,
    LocalModuleLayout,
    ModuleSpec,
)

TABLE_CONVERSION_REVISION = 1
"""Revision of the PEFT -> factor table / page conversion (write_adapter_to_slot,
dataplane.pool.packing): bump when what a slot holds for the same adapter changes."""
STACKED, PAGED = "stacked", "paged"


def single_device_kernel_local(*, adapter_semantic: str, specs: Sequence[ModuleSpec],
                               kernel_family: str, dtype: str, packing: str
                               ) -> KernelLocalIdentity:
    layouts = tuple(LocalModuleLayout(spec.name, A_AXES, B_STORED_AXES, None, None)
                    for spec in sorted(specs, key=lambda s: s.name))
    return KernelLocalIdentity(adapter_semantic=adapter_semantic, kernel_family=kernel_family,
                               conversion_revision=TABLE_CONVERSION_REVISION, dtype=dtype,
                               packing=packing, layouts=layouts)
