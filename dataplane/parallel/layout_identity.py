"""Recording the TP placement of an adapter in H_kernel_local (docs/ARCHITECTURE.md,
"Identities").

The per-module layout is recorded through `dataplane.identity.LocalModuleLayout` shard
ranges, and the four (style, layout) pairs have four distinct shard signatures, so the
collective schedule is a function of the record (`schedule_of`):

    style   layout                  a_shard axis   b_shard axis
    column  no_extra_collectives    —              output
    column  paper                   rank           output
    row     no_extra_collectives    input          —
    row     paper                   input          output

The collective contract those imply (bottleneck gathered in rank order / partials summed,
float32 on the wire, row-paper slices fused into the base all-reduce) is versioned by the
kernel family suffix `TP_SCHEDULE_REVISION`: changing any of it changes the digest.
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
from dataplane.parallel.shard import (
    COLUMN,
    LAYOUT_LOCAL,
    LAYOUT_PAPER,
    ROW,
    check_style_layout,
    shard_interval,
)

TP_SCHEDULE_REVISION = "tp-lora-v1"
CONVERSION_REVISION = 1
"""Revision of the PEFT -> local factor-table conversion (dataplane.parallel.shard)."""
B_PHYSICAL_AXES = B_STORED_AXES


def lora_local_layout(spec: ModuleSpec, *, style: str, layout: str, tp_rank: int,
                      tp_size: int, out_unit: int = 1, out_replicate: bool = False
                      ) -> LocalModuleLayout:
    """The `LocalModuleLayout` of `spec` on one rank for (style, layout); `out_replicate`:
    B's output units (k/v heads) may be shared by several ranks (`shard_interval`)."""
    check_style_layout(style, layout)
    a_shard = b_shard = None
    if style == COLUMN:
        b_shard = ShardRange("output", *shard_interval(spec.d_out, tp_rank, tp_size,
                                                       what=spec.name, unit=out_unit,
                                                       replicate=out_replicate))
        if layout == LAYOUT_PAPER:
            a_shard = ShardRange("rank", *shard_interval(spec.rank, tp_rank, tp_size,
                                                         what=f"{spec.name} rank"))
    else:
        a_shard = ShardRange("input", *shard_interval(spec.d_in, tp_rank, tp_size,
                                                      what=spec.name))
        if layout == LAYOUT_PAPER:
            b_shard = ShardRange("output", *shard_interval(spec.d_out, tp_rank, tp_size,
                                                           what=spec.name))
    return LocalModuleLayout(spec.name, A_AXES, B_PHYSICAL_AXES, a_shard, b_shard)


def schedule_of(layout: LocalModuleLayout) -> tuple[str, str]:
    """(style, layout) recorded by a `LocalModuleLayout` (inverse of `lora_local_layout`)."""
    a = None if layout.a_shard is None else layout.a_shard.axis
    b = None if layout.b_shard is None else layout.b_shard.axis
    table = {(None, "output"): (COLUMN, LAYOUT_LOCAL), ("rank", "output"): (COLUMN, LAYOUT_PAPER),
             ("input", None): (ROW, LAYOUT_LOCAL), ("input", "output"): (ROW, LAYOUT_PAPER)}
    if (a, b) not in table:
        raise UnknownLayoutError(f"{layout.name}: shard axes ({a}, {b}) name no TP schedule")
    return table[(a, b)]


def local_factor_scalars(spec: ModuleSpec, layout: LocalModuleLayout) -> int:
    """Scalars of A and B this rank stores under `layout` (rank-axis shards included);
    the axis-aware count is `LocalModuleLayout.local_scalars`."""
    return layout.local_scalars(spec)


def tp_kernel_local_identity(*, adapter_semantic: str, kernel_family: str,
                             conversion_revision: int, dtype: str, packing: str,
                             specs: Sequence[ModuleSpec],
                             choices: Mapping[str, tuple[str, str]], tp_rank: int,
                             tp_size: int, out_units: Mapping[str, int] | None = None,
                             replicated: Collection[str] = ()) -> KernelLocalIdentity:
    """H_kernel_local inputs of one rank: `choices[spec.name] = (style, layout)`;
    `replicated` names the modules whose output units may be shared (k/v heads)."""
    units = dict(out_units or {})
    layouts = []
    for spec in sorted(specs, key=lambda s: s.name):
        if spec.name not in choices:
            raise UnknownLayoutError(f"no TP layout chosen for {spec.name}")
        style, layout = choices[spec.name]
        layouts.append(lora_local_layout(spec, style=style, layout=layout, tp_rank=tp_rank,
                                         tp_size=tp_size, out_unit=units.get(spec.name, 1),
                                         out_replicate=spec.name in replicated))
    return KernelLocalIdentity(
        adapter_semantic=adapter_semantic,
        kernel_family=f"{kernel_family}+{TP_SCHEDULE_REVISION}",
        conversion_revision=conversion_revision, dtype=dtype, packing=packing,
        layouts=tuple(layouts), tp_rank=tp_rank, tp_size=tp_size)


def tp_contract_digest(adapter_semantic: str, tp_size: int,
                       choices: Mapping[str, tuple[str, str]]) -> str:
    """Digest every rank of one TP group must agree on before publishing (publication.py):
    the semantic adapter, the TP degree, the schedule revision and each module's
    (style, layout). Rank-specific shard ranges are not in it (they differ by design)."""
    check_digest(adapter_semantic, "adapter_semantic")
    modules: list[JSONValue] = []
    for name in sorted(choices):
        style, layout = choices[name]
        check_style_layout(style, layout)
        modules.append({"name": name, "style": style, "layout": layout})
    return digest({"h_adapter_semantic": adapter_semantic, "tp_size": tp_size,
                   "schedule_revision": TP_SCHEDULE_REVISION, "modules": modules})
