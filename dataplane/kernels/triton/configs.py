"""Tile configurations of the LoRA kernels per shape class.

Two-kernel path (shrink, then expand): class = (bucket of T, the rows in the step; bucket
of R, the module's physical rank). Fused launch (shrink and expand in one kernel): (T
class, module shape class, see ``fused_shape``). Gate/up expand folded into SiLU·mul: T
class. Decode steps have small T (one row per request), prefill steps large T; ``T`` is
static for a captured graph, so the choice costs nothing per step.

The tables are data. At import ``tuned/h200.json`` (tuned on the H200, used on every
device) is loaded, then each file named in ``ADAPTERPLANE_LORA_TUNED``
(``os.pathsep``-separated) in order, a later file's entries replacing earlier ones
(``load_tuned``). Every file has the same layout::

    {"shrink": {"<T>/<R>": ShrinkConfig fields, ...},
     "expand": {"<T>/<R>": ExpandConfig fields, ...},
     "fused":  {"<T>/<shape>": FusedConfig fields, ...},
     "silu":   {"<T>": ExpandConfig fields or null, ...}}

``<T>`` is a ``T_BUCKETS`` edge (``FUSED_T_CLASSES`` for ``fused``), ``<R>`` an
``R_BUCKETS`` edge, ``<shape>`` one of ``FUSED_SHAPES``; any section or key may be left
out. The shipped file lists every key. ``bench/lora_kernels.py --tune`` writes the
``shrink``, ``expand`` and ``fused`` sections of the tables it ran with,
``bench/lora_silu.py --sweep`` the ``silu`` section (``$OUT/tuned_configs.json``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from typing import Any

T_BUCKETS = (16, 64, 256, 1024, 4096, 1 << 30)
R_BUCKETS = (16, 32, 64, 128, 256)
FUSED_SHAPES = ("square", "qkv", "wide", "deep")
FUSED_T_CLASSES = (16, 64, 256, 1024, 4096)
"""T classes a fused entry may have: steps above 4,096 rows always take two kernels."""
FUSED_MAX_RANK = 128
"""Steps with a higher rank take two kernels whatever ``FUSED_TABLE`` holds."""
TUNED_FILE = os.path.join(os.path.dirname(__file__), "tuned", "h200.json")
"""The shipped tables, loaded at import before ``ADAPTERPLANE_LORA_TUNED``."""


@dataclass(frozen=True)
class ShrinkConfig:
    """``z = x @ A^T`` tiles: rows × rank × K. ``split_k`` is the most K splits
    (fp32 partials) a launch may use; the kernel picks the actual number on the
    device from the live row tiles: the largest power of two ``<= split_k``
    keeping ``tiles * splits <= per_sm * multiprocessors`` programs (the expand
    derives the same number from the same config). Partials go to separate
    ``z[split]`` slices summed by the expand while it loads ``z``: no atomics,
    so ``z`` and ``y`` are deterministic for any split (bit-identical repeats).
    """

    block_m: int
    block_r: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    per_sm: int = 2
    evict_x: bool = False  # evict-first hint on the x stream (prefill)
    row_split: int = 0
    """0: every slot gets the launch's split count. ``n > 0``: a slot's count is that
    times ``next_pow2(ceil(min(rows, block_m) / n))`` (capped at ``split_k``): in a mixed
    step a full prefill tile streams ``block_m`` rows of ``x`` besides the factors, a
    one-row decode tile almost only the factors, so the heavy tiles get more programs."""
    pdl: int = 0  # 1: programmatic dependent launch (Hopper+), see ``ops.pdl_launch``
    pack: int = 0
    """0: one program per slice. ``w > 0``: a multi-slice module whose ranks fit
    ``block_r`` runs one program per (tile, split) for all its slices when
    ``next_pow2(slices) * block_r <= w`` (``x`` read once instead of once per slice)."""


@dataclass(frozen=True)
class ExpandConfig:
    """``y += s z @ Bt`` tiles: rows × output columns × rank chunk; each program
    covers ``n_iters`` consecutive column tiles. ``y_prefetch``: the column
    loop loads the next ``y`` tile ahead instead of the next ``Bt`` tile
    (``lora_expand_kernel``'s ``Y_PREFETCH``); in the gate/up fold
    (``expand_silu_kernel.py``'s ``PREFETCH``) the next gate, up and both ``Bt`` tiles,
    where it otherwise loads each tile's in turn."""

    block_m: int
    block_n: int
    block_r: int
    num_warps: int
    num_stages: int
    n_iters: int = 1
    y_prefetch: bool = False
    pdl: int = 0  # 1: programmatic dependent launch (Hopper+), see ``ops.pdl_launch``


@dataclass(frozen=True)
class FusedConfig:
    """Decode-sized steps: shrink and expand in one launch (``fused_kernel.py``).

    ``block_r`` is not stored: it is the module's rank bucket (one rank chunk).
    ``block_n`` = about ``n_elems // block_r`` output columns per tile (``fused_block_n``).
    ``per_sm`` bounds live programs (``per_sm`` × multiprocessors) when the
    device picks the split; ``split_k`` is the most K splits. ``min_split``:
    the device never picks fewer K splits than this, even where that exceeds
    the ``per_sm`` bound (q/k/v with 64 live slots = 192 tiles would otherwise
    get 1 split, each program streaming all of K alone). ``pipe``: 0 = the
    expand loop prefetches the next column tile by hand; k >= 2 = Triton's
    software pipeline, k stages. ``pdl``: 1 = programmatic dependent launch on
    Hopper and later (the launch and the shrink overlap the end of the previous
    kernel; ``fused_kernel.py``). ``weighted``: 1 = a slice's K splits / column
    shares scale with its factor bytes (q/k/v: the q slice, four times as wide as
    k or v under GQA, gets more items) instead of the same for all.
    """

    block_m: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    per_sm: int = 2
    n_elems: int = 8192
    min_split: int = 2
    pipe: int = 0
    pdl: int = 0
    weighted: int = 0


def bucket(value: int, edges: tuple[int, ...]) -> int:
    for edge in edges:
        if value <= edge:
            return edge
    return edges[-1]


# Filled at import (end of this module) from TUNED_FILE, then ADAPTERPLANE_LORA_TUNED.
SHRINK_TABLE: dict[tuple[int, int], ShrinkConfig] = {}
"""(T bucket, R bucket) -> shrink tile; a key it lacks takes ``default_shrink``."""
EXPAND_TABLE: dict[tuple[int, int], ExpandConfig] = {}
"""(T bucket, R bucket) -> expand tile; a key it lacks takes ``default_expand``."""
FUSED_TABLE: dict[tuple[int, str], FusedConfig] = {}
"""(T class, shape class) -> fused launch; a key it lacks takes the two kernels."""
SILU_TABLE: dict[int, ExpandConfig | None] = {}
"""T class -> tile of the gate/up expand folded into SiLU·mul (``expand_silu_kernel.py``);
``None`` or no entry: not folded (two-kernel ``add_lora`` on gate/up, then the
activation)."""

# Candidates of the prefill shrink sweep (`bench/lora_tune.py`, T = 4096; the first is
# timed first), (block_m, block_r, block_k, split_k, warps, stages, per_sm, evict_x);
# block_r is capped at the rank bucket when installed. At T = 4096 with n = 4 (one tile
# per BLOCK_M rows) the device picks: BLOCK_M 16 -> 256 tiles, 32 -> 128, 64 -> 64,
# 128 -> 32; splits = largest power of two <= split_k with tiles * splits <= per_sm * 132.
# Larger BLOCK_M re-reads A less (A bytes per x byte = rank / BLOCK_M from L2) but needs
# more splits (more z partials).
PREFILL_SHRINK_CANDIDATES: tuple[ShrinkConfig, ...] = (
    ShrinkConfig(32, 64, 128, 8, 4, 3, 2),  # 2 splits, 256 programs
    ShrinkConfig(32, 64, 128, 8, 4, 4, 4),  # 4 splits, 512 programs
    ShrinkConfig(32, 64, 64, 8, 4, 5, 4),
    ShrinkConfig(16, 64, 128, 8, 4, 4, 4),  # 256 tiles, 2 splits
    ShrinkConfig(16, 64, 256, 8, 4, 3, 2),  # 256 tiles, 1 split
    ShrinkConfig(64, 64, 128, 8, 4, 3, 2),  # 4 splits
    ShrinkConfig(64, 64, 64, 8, 4, 4, 4),  # 8 splits
    ShrinkConfig(64, 64, 256, 8, 8, 3, 2),
    ShrinkConfig(128, 64, 64, 16, 8, 4, 2),  # 8 splits
    ShrinkConfig(128, 64, 128, 16, 8, 3, 4),  # 16 splits
    ShrinkConfig(32, 64, 128, 8, 4, 3, 2, True),  # the first + evict-first x
    ShrinkConfig(64, 64, 128, 8, 4, 4, 4, True),
)


def fused_shape(in_features: int, out_features: tuple[int, ...]) -> str:
    """Module shape class: ``qkv`` (3+ slices), ``wide`` (2 slices: gate/up, whole or
    a tensor-parallel shard; or one slice over twice the input width), ``deep`` (input
    at least 1.5x the widest slice: down, 14,336 -> 4,096, and its TP=2 shard 7,168 ->
    4,096), else ``square`` (o, also its TP=2 shard 2,048 -> 4,096)."""
    if len(out_features) >= 3:
        return "qkv"
    if len(out_features) == 2:
        return "wide"
    widest = max(out_features, default=in_features)
    if widest > 2 * in_features:
        return "wide"
    if 2 * in_features >= 3 * widest:
        return "deep"
    return "square"


def fused_config(
    num_rows: int, max_rank: int, in_features: int, out_features: tuple[int, ...] = ()
) -> FusedConfig | None:
    """Config of the fused launch, or ``None`` where two kernels are used."""
    key = (bucket(num_rows, T_BUCKETS), fused_shape(in_features, out_features))
    cfg = FUSED_TABLE.get(key)
    if cfg is None or max_rank > FUSED_MAX_RANK:
        return None
    k_tiles = max(1, -(-in_features // cfg.block_k))
    return replace(cfg, split_k=min(cfg.split_k, k_tiles))


def silu_config(num_rows: int, max_rank: int) -> ExpandConfig | None:
    """Tile of the folded gate/up expand for this step, None = do not fold."""
    cfg = SILU_TABLE.get(bucket(num_rows, T_BUCKETS))
    if cfg is None:
        return None
    block_r = min(64, max(16, bucket(max_rank, R_BUCKETS)))
    return cfg if cfg.block_r == block_r else replace(cfg, block_r=block_r)


def silu_table_json() -> dict[str, dict[str, int | bool] | None]:
    """``SILU_TABLE`` as JSON-able ``{"<T class>": fields or null}``."""
    return {str(t): None if c is None else asdict(c) for t, c in sorted(SILU_TABLE.items())}


def fused_table_json() -> dict[str, dict[str, int]]:
    """``FUSED_TABLE`` as JSON-able ``{"<T class>/<shape>": fields}``."""
    return {f"{t}/{shape}": asdict(c) for (t, shape), c in sorted(FUSED_TABLE.items())}


def two_kernel_tables_json() -> dict[str, dict[str, dict[str, int | bool]]]:
    """``SHRINK_TABLE`` and ``EXPAND_TABLE`` as ``{"shrink" | "expand": {"<T>/<R>": fields}}``."""
    return {
        "shrink": {f"{t}/{r}": asdict(c) for (t, r), c in sorted(SHRINK_TABLE.items())},
        "expand": {f"{t}/{r}": asdict(c) for (t, r), c in sorted(EXPAND_TABLE.items())},
    }


def _two_kernel_entries(path: str, data: dict[str, Any], name: str,
                        cls: type[ShrinkConfig] | type[ExpandConfig]
                        ) -> dict[tuple[int, int], Any]:
    out: dict[tuple[int, int], Any] = {}
    for key, fields in data.get(name, {}).items():
        t, _, r = key.partition("/")
        if not (t.isdigit() and r.isdigit() and int(t) in T_BUCKETS and int(r) in R_BUCKETS):
            raise ValueError(f"{path}: unknown {name} key {key!r}")
        try:
            out[(int(t), int(r))] = cls(**fields)
        except TypeError as exc:
            raise ValueError(f"{path}: bad fields for {name} {key!r}: {exc}") from exc
    return out


def load_tuned(path: str) -> None:
    """Install the entries of a tables file (layout: the module docstring) over the
    current tables, key by key: ``"shrink"`` and ``"expand"`` (keys ``"<T class>/<rank
    bucket>"``), ``"fused"`` (keys ``"<T class>/<shape>"``) and ``"silu"`` (keys
    ``"<T class>"``, null = do not fold). Keys the file lacks keep their entries.
    Unknown keys or fields raise ``ValueError``: a stale file must not half-apply."""
    with open(path) as f:
        data = json.load(f)
    shrink = _two_kernel_entries(path, data, "shrink", ShrinkConfig)
    expand = _two_kernel_entries(path, data, "expand", ExpandConfig)
    fused: dict[tuple[int, str], FusedConfig] = {}
    for key, fields in data.get("fused", {}).items():
        t, _, shape = key.partition("/")
        if not t.isdigit() or int(t) not in FUSED_T_CLASSES or shape not in FUSED_SHAPES:
            raise ValueError(f"{path}: unknown fused key {key!r}")
        try:
            fused[(int(t), shape)] = FusedConfig(**fields)
        except TypeError as exc:
            raise ValueError(f"{path}: bad fields for {key!r}: {exc}") from exc
    silu: dict[int, ExpandConfig | None] = {}
    for key, fields in data.get("silu", {}).items():
        if not key.isdigit() or int(key) not in T_BUCKETS:
            raise ValueError(f"{path}: unknown silu key {key!r}")
        try:
            silu[int(key)] = None if fields is None else ExpandConfig(**fields)
        except TypeError as exc:
            raise ValueError(f"{path}: bad fields for silu {key!r}: {exc}") from exc
    FUSED_TABLE.update(fused)
    SILU_TABLE.update(silu)
    SHRINK_TABLE.update(shrink)
    EXPAND_TABLE.update(expand)


def default_shrink(t_bucket: int, r_bucket: int) -> ShrinkConfig:
    """Shrink tile of a (T bucket, R bucket) key ``SHRINK_TABLE`` lacks."""
    block_r = min(r_bucket, 64)
    if t_bucket <= 256:
        return ShrinkConfig(16, block_r, 128, 32, 4, 3)
    if t_bucket <= 1024:
        return ShrinkConfig(32, block_r, 128, 16, 4, 3)
    return ShrinkConfig(64, block_r, 128, 8, 4, 3)


def default_expand(t_bucket: int, r_bucket: int) -> ExpandConfig:
    """Expand tile of a (T bucket, R bucket) key ``EXPAND_TABLE`` lacks."""
    block_r = min(r_bucket, 64)
    if t_bucket <= 256:
        return ExpandConfig(16, 256, block_r, 4, 2, 1)
    if t_bucket <= 1024:
        return ExpandConfig(32, 128, block_r, 4, 3, 2)
    return ExpandConfig(64, 128, block_r, 4, 3, 2)


def shrink_entry(num_rows: int, max_rank: int) -> ShrinkConfig:
    """The table entry of a shrink over ``num_rows`` rows, before the K-dependent caps
    (its ``block_m`` and ``per_sm`` are what the expand needs to find the split)."""
    key = (bucket(num_rows, T_BUCKETS), bucket(max_rank, R_BUCKETS))
    return SHRINK_TABLE.get(key) or default_shrink(*key)


def shrink_config(num_rows: int, max_rank: int, in_features: int) -> ShrinkConfig:
    """Config for a shrink over ``num_rows`` rows; split-K capped so every split
    has at least one K tile."""
    key = (bucket(num_rows, T_BUCKETS), bucket(max_rank, R_BUCKETS))
    cfg = shrink_entry(num_rows, max_rank)
    k_tiles = max(1, -(-in_features // cfg.block_k))
    split = min(cfg.split_k, k_tiles)
    block_r = min(cfg.block_r, max(16, key[1]))
    if split != cfg.split_k or block_r != cfg.block_r:
        cfg = replace(cfg, block_r=block_r, split_k=split)
    return cfg


def fit_shrink_smem(cfg: ShrinkConfig, elem_bytes: int, limit: int = 200_000) -> ShrinkConfig:
    """``cfg`` with fewer stages, then a halved ``block_k``, until the pipelined
    ``x`` and ``A`` tiles fit shared memory for this element size.

    Triton buffers ``num_stages - 1`` copies of both tiles (see
    ``fused_ops.fused_block_k``; the H200 allows 232,448 bytes). The bf16
    table entries fit as they are; fp32 (twice the bytes) may not. Neither
    change touches ``split_k`` (the ``z`` shape) nor the device's split choice.
    """
    stages, bk = cfg.num_stages, cfg.block_k

    def need() -> int:
        return max(1, stages - 1) * (cfg.block_m + cfg.block_r) * bk * elem_bytes

    while stages > 2 and need() > limit:
        stages -= 1
    while bk > 32 and need() > limit:
        bk //= 2
    if (stages, bk) == (cfg.num_stages, cfg.block_k):
        return cfg
    return replace(cfg, num_stages=stages, block_k=bk)


def expand_config(num_rows: int, max_rank: int) -> ExpandConfig:
    """Config for an expand over ``num_rows`` rows; ``block_r`` capped at the rank
    bucket (at least 16)."""
    key = (bucket(num_rows, T_BUCKETS), bucket(max_rank, R_BUCKETS))
    cfg = EXPAND_TABLE.get(key) or default_expand(*key)
    block_r = min(cfg.block_r, max(16, key[1]))
    if block_r != cfg.block_r:
        cfg = replace(cfg, block_r=block_r)
    return cfg


def max_split_k() -> int:
    """Largest split any table entry uses (sizes the workspace)."""
    splits = [c.split_k for c in SHRINK_TABLE.values()]
    splits += [default_shrink(t, r).split_k for t in T_BUCKETS for r in R_BUCKETS]
    return max(splits)


load_tuned(TUNED_FILE)
for _tuned in filter(None, os.environ.get("ADAPTERPLANE_LORA_TUNED", "").split(os.pathsep)):
    load_tuned(_tuned)  # e.g. the fused sweep's file, then the folded-SiLU sweep's
