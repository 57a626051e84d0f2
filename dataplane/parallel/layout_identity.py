"""Recording the TP placement of an adapter in H_kernel_local (docs/ARCHITECTURE.md,
"Identities").

Each module's shard is recorded through `dataplane.identity.LocalModuleLayout` shard
ranges, one signature per parallel style (dataplane/parallel/shard_model.py):

    style   a_shard axis   b_shard axis
    column  —              output
    row     input          —

so the style, and with it the collective schedule, is a function of the record
(`style_of`). That schedule (row partials summed by the base all-reduce, no LoRA
collective) is versioned by the kernel family suffix `TP_SCHEDULE_REVISION`: changing it
changes the digest.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from dataplane.identity import (
    A_AXES,
    B_STORED_AXES,
    JSONValue,
    KernelLocalIdentity,
    LocalModuleLayout,
    ModuleSpec,
    ShardRange,
    check_digest,
    digest,
)
from dataplane.parallel.errors import UnknownLayoutError
from dataplane.parallel.shard import COLUMN, ROW, check_style, shard_interval

TP_SCHEDULE_REVISION = "tp-lora-v2"
CONVERSION_REVISION = 1
"""Revision of the PEFT -> local shard conversion (dataplane/parallel/shard.py)."""


def lora_local_layout(spec: ModuleSpec, *, style: str, tp_rank: int, tp_size: int,
                      out_unit: int = 1, out_replicate: bool = False) -> LocalModuleLayout:
    """The `LocalModuleLayout` of `spec` on one rank; `out_replicate`: B's output units
    (k/v heads) may be shared by several ranks (`shard_interval`)."""
    check_style(style)
    a_shard = b_shard = None
    if style == COLUMN:
        b_shard = ShardRange("output", *shard_interval(spec.d_out, tp_rank, tp_size,
                                                       what=spec.name, unit=out_unit,
                                                       replicate=out_replicate))
    else:
        a_shard = ShardRange("input", *shard_interval(spec.d_in, tp_rank, tp_size,
                                                      what=spec.name))
    return LocalModuleLayout(spec.name, A_AXES, B_STORED_AXES, a_shard, b_shard)


def style_of(layout: LocalModuleLayout) -> str:
    """The parallel style a `LocalModuleLayout` records (inverse of `lora_local_layout`)."""
    a = None if layout.a_shard is None else layout.a_shard.axis
    b = None if layout.b_shard is None else layout.b_shard.axis
    table = {(None, "output"): COLUMN, ("input", None): ROW}
    if (a, b) not in table:
        raise UnknownLayoutError(f"{layout.name}: shard axes ({a}, {b}) name no TP schedule")
    return table[(a, b)]


def tp_kernel_local_identity(*, adapter_semantic: str, kernel_family: str,
                             conversion_revision: int, dtype: str, packing: str,
                             specs: Sequence[ModuleSpec], styles: Mapping[str, str],
                             tp_rank: int, tp_size: int,
                             out_units: Mapping[str, int] | None = None,
                             replicated: Collection[str] = ()) -> KernelLocalIdentity:
    """H_kernel_local inputs of one rank: `styles[spec.name]` its parallel style;
    `replicated` names the modules whose output units may be shared (k/v heads)."""
    units = dict(out_units or {})
    layouts = []
    for spec in sorted(specs, key=lambda s: s.name):
        if spec.name not in styles:
            raise UnknownLayoutError(f"no parallel style for {spec.name}")
        layouts.append(lora_local_layout(spec, style=styles[spec.name], tp_rank=tp_rank,
                                         tp_size=tp_size, out_unit=units.get(spec.name, 1),
                                         out_replicate=spec.name in replicated))
    return KernelLocalIdentity(
        adapter_semantic=adapter_semantic,
        kernel_family=f"{kernel_family}+{TP_SCHEDULE_REVISION}",
        conversion_revision=conversion_revision, dtype=dtype, packing=packing,
        layouts=tuple(layouts), tp_rank=tp_rank, tp_size=tp_size)


def tp_contract_digest(adapter_semantic: str | None, tp_size: int, slot: int,
                       pages: tuple[int, ...]) -> str:
    """Digest every rank of one TP group must agree on before publishing (publication.py):
    the semantic adapter, the TP degree, the schedule revision and where the shard lives
    (slot and pool pages, the leader's placement). Rank-specific shard ranges are not in
    it (they differ by design)."""
    if adapter_semantic is not None:
        check_digest(adapter_semantic, "adapter_semantic")
    record: JSONValue = {"h_adapter_semantic": adapter_semantic, "tp_size": tp_size,
                         "schedule_revision": TP_SCHEDULE_REVISION, "slot": slot,
                         "pages": list(pages)}
    return digest(record)
