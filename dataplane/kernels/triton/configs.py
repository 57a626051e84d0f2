"""Tile configurations per shape class, tuned offline on the H200.

Shape class = (bucket of T, the rows in the step; bucket of R, the module's
physical rank). Decode steps have small T (one row per request), prefill steps
large T; ``T`` is static for a captured graph, so the choice costs nothing per
step. ``bench/lora_kernels.py --tune`` times the candidates in
``SHRINK_CANDIDATES`` / ``EXPAND_CANDIDATES`` on the device and prints the
winning table, which is pasted into ``SHRINK_TABLE`` / ``EXPAND_TABLE``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from typing import Any

T_BUCKETS = (16, 64, 256, 1024, 4096, 1 << 30)
R_BUCKETS = (16, 32, 64, 128, 256)


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
    get 1 split, each program streaming all of K alone, measured 68 µs vs 57
    for two kernels). ``pipe``: 0 = the expand loop prefetches the next
    column tile by hand; k >= 2 = Triton's software pipeline, k stages. ``pdl``: 1 =
    programmatic dependent launch on Hopper and later (the launch and the shrink overlap
    the end of the previous kernel; ``fused_kernel.py``). ``weighted``: 1 = a slice's
    K splits / column shares scale with its factor bytes (q/k/v: the q slice, four
    times as wide as k or v under GQA, gets more items) instead of the same for all.
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


# Winners of `bench/lora_kernels.py --tune` on the H200, 2026-11-29 (docs/PERFORMANCE.md):
# swept per T class at r = 64, installed for every rank bucket with block_r capped at
# the bucket. T classes 16 and > 4096 were not swept: they take the nearest swept
# class; T <= 1024 keeps `default_*` (between decode and prefill, not swept yet).
_TUNED_SHRINK = {
    64: ShrinkConfig(16, 64, 256, 32, 4, 3),
    256: ShrinkConfig(16, 64, 128, 32, 4, 3),
    1024: ShrinkConfig(32, 64, 128, 16, 4, 3),  # = default_shrink: not swept yet
    4096: ShrinkConfig(32, 64, 128, 8, 4, 3),
}
_TUNED_EXPAND = {
    64: ExpandConfig(16, 256, 64, 4, 2, 1),
    256: ExpandConfig(16, 256, 64, 4, 2, 1),
    1024: ExpandConfig(32, 128, 64, 4, 3, 2),  # = default_expand: not swept yet
    4096: ExpandConfig(64, 128, 64, 4, 3, 4),
}
# Per rank group (key: (T class, 16) for rank buckets <= 32, (T class, 64) above),
# overriding `_TUNED_EXPAND` there. `--tune` sweeps prefill r = 16 and r = 64 apart.
# Measured on the H200 (two runs, 2026-11-29): r = 16 prefill expand 24.7 µs with 32-row
# tiles and 8 column tiles per program (no `y` prefetch) vs 28.3-28.6 for the 64-row
# entry and 27.1-27.2 with the prefetch; r = 64 keeps `_TUNED_EXPAND` (34.4-34.7 µs,
# every other candidate slower: 35.3-55.6).
# T class 1024 at r = 16 (`--tune-sweeps mixed`, the mixed T=704 n=53 cases, H200
# 2026-11-30): 16-row tiles, 4 column tiles per program, 38.4 µs add_lora geomean
# against 46.7 for the default.
EXPAND_BY_RANK: dict[tuple[int, int], ExpandConfig] = {
    (1024, 16): ExpandConfig(16, 128, 64, 4, 3, 4, pdl=1),
    (4096, 16): ExpandConfig(32, 128, 64, 4, 3, 8, pdl=1),
}
# Prefill shrink per rank group, overriding `_TUNED_SHRINK` (same keys as
# `EXPAND_BY_RANK`). `--tune` sweeps `PREFILL_SHRINK_CANDIDATES` for r = 16 and
# r = 64 at n = 4 and 32 (metric: the whole two-kernel add_lora, since the
# number of K splits also sets the expand's z reads). Measured on the H200
# (2026-11-29): r = 64 wins with the committed tile plus the evict-first hint on x
# (54.07 µs add_lora geomean; r = 64 n = 4 shrink 17.9 µs vs 18.5); r = 16 keeps
# `_TUNED_SHRINK` (39.0 µs geomean).
# T class 1024 at r = 16 (same mixed sweep, with the expand above): 64-row tiles, up
# to 8 K splits, 34.8 µs add_lora geomean against 38.4.
# T class 4096 at r = 16 (mixed sweep on a 2,600-row mixed step's four modules plus
# prefill T = 4096 n = 4 / 32, H200 2026-11-30): up to 16 K splits with 4 programs per
# SM, 53.4 µs add_lora geomean against 56.1 (prefill n = 4 38.0 vs 39.4 µs).
# `pdl=1` (programmatic dependent launch) on the r = 16 mixed classes: 34.25 vs 34.64 µs
# (T class 1024), 52.74 vs 53.01 (4096). `pack=64` (q/k/v and gate/up: every slice in
# one program, `x` read once; same run, same kernels with and without): prefill
# T = 4096 n = 32 q/k/v 57.5 vs 73.6 µs (shrink 18.4 vs 33.7), mixed T = 704 q/k/v 28.5
# vs 32.7, gate/up two-kernel 61.6 vs 64.6; single-slice modules unchanged.
SHRINK_BY_RANK: dict[tuple[int, int], ShrinkConfig] = {
    (1024, 16): ShrinkConfig(64, 64, 128, 8, 4, 3, 2, pdl=1, pack=64),
    (4096, 16): ShrinkConfig(32, 64, 128, 16, 4, 3, 4, pdl=1, pack=64),
    (4096, 64): ShrinkConfig(32, 64, 128, 8, 4, 3, 2, True),
}
# Candidates of that sweep, (block_m, block_r, block_k, split_k, warps, stages,
# per_sm, evict_x); block_r is capped at the rank bucket when installed. At T = 4096 with
# n = 4 (one tile per BLOCK_M rows) the device picks: BLOCK_M 16 -> 256 tiles,
# 32 -> 128, 64 -> 64, 128 -> 32; splits = largest power of two <= split_k with
# tiles * splits <= per_sm * 132. Larger BLOCK_M re-reads A less (A bytes per x
# byte = rank / BLOCK_M from L2) but needs more splits (more z partials).
PREFILL_SHRINK_CANDIDATES: tuple[ShrinkConfig, ...] = (
    ShrinkConfig(32, 64, 128, 8, 4, 3, 2),  # committed: 2 splits, 256 programs
    ShrinkConfig(32, 64, 128, 8, 4, 4, 4),  # 4 splits, 512 programs
    ShrinkConfig(32, 64, 64, 8, 4, 5, 4),
    ShrinkConfig(16, 64, 128, 8, 4, 4, 4),  # 256 tiles, 2 splits
    ShrinkConfig(16, 64, 256, 8, 4, 3, 2),  # 256 tiles, 1 split
    ShrinkConfig(64, 64, 128, 8, 4, 3, 2),  # 4 splits
    ShrinkConfig(64, 64, 64, 8, 4, 4, 4),  # 8 splits
    ShrinkConfig(64, 64, 256, 8, 8, 3, 2),
    ShrinkConfig(128, 64, 64, 16, 8, 4, 2),  # 8 splits
    ShrinkConfig(128, 64, 128, 16, 8, 3, 4),  # 16 splits
    ShrinkConfig(32, 64, 128, 8, 4, 3, 2, True),  # committed + evict-first x
    ShrinkConfig(64, 64, 128, 8, 4, 4, 4, True),
)
# T class 1024 (257-1024 rows) is the engine's typical mixed step: a few prefill runs
# plus ~100 one-row decode slots; `--tune --tune-sweeps mixed` sweeps it.
_NEAREST = {16: 64, 64: 64, 256: 256, 1024: 1024, 4096: 4096, 1 << 30: 4096}


def rank_group(r_bucket: int) -> int:
    """Rank buckets sharing one expand entry: 16 (r <= 32) or 64 (r > 32)."""
    return 16 if r_bucket <= 32 else 64


# Keys: (T bucket, R bucket). Entries missing here fall back to `default_*`.
SHRINK_TABLE: dict[tuple[int, int], ShrinkConfig] = {
    (t, r): replace(
        SHRINK_BY_RANK.get((src, rank_group(r)), _TUNED_SHRINK[src]), block_r=min(64, r)
    )
    for t, src in _NEAREST.items()
    for r in R_BUCKETS
}
EXPAND_TABLE: dict[tuple[int, int], ExpandConfig] = {
    (t, r): replace(
        EXPAND_BY_RANK.get((src, rank_group(r)), _TUNED_EXPAND[src]), block_r=min(64, r)
    )
    for t, src in _NEAREST.items()
    for r in R_BUCKETS
}


# Fused decode path (one launch): T classes up to 256; larger steps use two kernels.
# Keyed by (T class, module shape class, see `fused_shape`): the modules of one model
# want different grids (measured on the H200, 2026-11-29, 128-row steps over 50 slots,
# rank 16: q/k/v is fastest unsplit, 25.1 µs vs 30.2 with 2 splits, while gate/up's
# 14,336-wide B wants the software-pipelined expand, 32.4 µs vs 38.4 by hand).
# `bench/lora_kernels.py --tune --tune-sweeps fused` sweeps every class and writes the
# winners to tuned_configs.json (load it with ADAPTERPLANE_LORA_TUNED=path, or paste).
FUSED_MAX_RANK = 128
FUSED_SHAPES = ("square", "qkv", "wide", "deep")
_FUSED_BASE = {
    16: FusedConfig(16, 256, 16, 4, 3),
    64: FusedConfig(16, 256, 16, 4, 3),
    256: FusedConfig(16, 128, 32, 4, 3),
}
# Winners of that sweep (H200, 2026-11-30 01:10 UTC; rank 16, 128-row steps for the
# T <= 256 class, 64-row for T <= 64): 256-column tiles (n_elems 4,096) everywhere but
# gate/up, whose 14,336-wide slices keep 512 (31.8 vs 34.9 µs at 50 slots); q/k/v 21.6
# µs at 50 slots (27.5 with 512-column tiles: now faster than two kernels, 24.8); down
# with BLOCK_K 512 (19.3 vs 22.4). The one-slot square case is back to 7.0 µs (8.0 with
# 512-column tiles). Ranks >= 64 keep 128-column tiles (see `fused_block_n`).
# Then the depth sweep (`--tune-sweeps fuseddepth`, H200 2026-11-30 08:00 UTC, same
# cases): programmatic dependent launch (`pdl`) wins in every class (1-3%: 9.64 vs 9.89
# µs square, 22.42 vs 22.81 wide at T <= 256); four pipeline stages for the T <= 64
# q/k/v and down and the T <= 256 square; `weighted` slices for the T <= 256 q/k/v
# (14.54 vs 15.08 µs geomean: 17.6 vs 21.1 at 50 slots, 12.0 vs 10.8 at 16).
_FUSED_TUNED: dict[tuple[int, str], dict[str, int]] = {
    (256, "square"): {"per_sm": 2, "min_split": 1, "pipe": 3, "n_elems": 4096, "num_stages": 4},
    (256, "qkv"): {"per_sm": 3, "min_split": 1, "pipe": 3, "n_elems": 4096, "weighted": 1},
    (256, "wide"): {"per_sm": 2, "min_split": 1, "pipe": 3, "n_elems": 8192},
    (256, "deep"): {"per_sm": 2, "min_split": 1, "pipe": 3, "n_elems": 4096, "block_k": 512},
    (64, "square"): {"per_sm": 2, "min_split": 2, "pipe": 0, "n_elems": 4096},
    (64, "qkv"): {"per_sm": 3, "min_split": 1, "pipe": 3, "n_elems": 4096, "num_stages": 4},
    (64, "wide"): {"per_sm": 2, "min_split": 2, "pipe": 3, "n_elems": 8192},
    (64, "deep"): {"per_sm": 2, "min_split": 1, "pipe": 3, "n_elems": 4096, "num_stages": 4},
}
FUSED_TABLE: dict[tuple[int, str], FusedConfig] = {
    (t, shape): replace(cfg, pdl=1, **_FUSED_TUNED[(64 if t == 16 else t, shape)])
    for t, cfg in _FUSED_BASE.items()
    for shape in FUSED_SHAPES
}
# Mixed steps (T class 1,024, the mixed sweep on a 704-row step over 53 slots, H200
# 2026-11-30): one fused launch beats the two kernels for the square (17.98 vs 19.69
# µs), gate/up (49.49 vs 66.05) and down (31.38 vs 32.41) modules; q/k/v keeps the two
# kernels (33.44 vs 33.65).
FUSED_TABLE.update({
    (1024, "square"): FusedConfig(16, 256, 32, 4, 3, 2, 4096, 1, 3),
    (1024, "wide"): FusedConfig(16, 128, 32, 4, 3, 2, 4096, 2, 3),
    (1024, "deep"): FusedConfig(16, 256, 32, 4, 3, 2, 4096, 1, 3),
    # Prefill steps (T class 4,096, `--tune-sweeps prefillfused`, H200 2026-11-30 11:00
    # UTC): one fused launch with 32-row tiles beats the two kernels for the square class
    # over prefill n=4/32 at r16/r64 and a 2,600-row mixed o (39.51 vs 42.57 µs geomean;
    # r=64 n=4 43.2 vs 52.1, i.e. 2.09x -> 1.75x the floor).
    (4096, "square"): FusedConfig(32, 128, 16, 4, 3, 3, 4096, 1, 3),
})
# T classes a fused entry may have. Mixed steps (T class 1,024) use two kernels where
# the mixed sweep (`bench/lora_kernels.py --tune --tune-sweeps mixed`) found no fused
# config faster for the module class (q/k/v above); a tuned file may install one. T class
# 4,096 has the square class only (`--tune-sweeps prefillfused` tries tall-tile ones).
FUSED_T_CLASSES = (16, 64, 256, 1024, 4096)


# TP=2 shards of gate/up (4,096 -> 2 x 7,168) and down (7,168 -> 4,096) used to fall in
# the square class; in the wide / deep classes the TP=2 decode step with 128 adapters ran
# 7.22 vs 7.36 ms (2 x H200, `bench/tp.py`, session 13; 16 adapters 6.50 vs 6.49).
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


# The gate/up expand folded into SiLU·mul (`expand_silu_kernel.py`) per T class, or None:
# do not fold (two-kernel `add_lora` on gate/up, then the activation). Measured on the
# H200 (2026-11-30, Llama-8B gate/up, `bench/lora_silu.py --sweep`): with the plain
# expand's tile (32 x 128) the fold took 299-327 µs per layer at T = 4,096 against 252
# for add_lora + SiLU·mul; with 16-row tiles 216 vs 254 µs (32 adapters) and 239 vs 250
# (4 adapters), so steps above 1,024 rows fold; at T = 1,024 (8 adapters, rank 16) the
# best tile lost (99 vs 89 µs): no entry (gate/up steps of that class now take the fused
# launch). Session 12 (`--sweep` with `y_prefetch` candidates: each column tile's gate,
# up and factor tiles loaded one tile ahead): 16 x 64 tiles, 16 per program, prefetched,
# 194.6 µs geomean at T = 4,096 vs 223.7 for the tile above (LoRA's own cost 99.5 /
# 116.3 µs over SiLU·mul alone at n = 32 / 4, was ≈ 128). tuned_configs.json
# (ADAPTERPLANE_LORA_TUNED) overrides per class.
_SILU_TILE = ExpandConfig(16, 64, 64, 4, 3, 16, y_prefetch=True)
SILU_TABLE: dict[int, ExpandConfig | None] = {
    t: _SILU_TILE if t > 1024 else None for t in T_BUCKETS
}


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
    """Install entries from a ``tuned_configs.json``: ``"fused"`` (written by
    ``bench/lora_kernels.py --tune``, keys ``"<T class>/<shape>"``), ``"shrink"`` and
    ``"expand"`` (the same, keys ``"<T class>/<rank bucket>"``) and ``"silu"``
    (``bench/lora_silu.py --sweep``, keys ``"<T class>"``, null = do not fold).
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
    block_r = min(r_bucket, 64)
    if t_bucket <= 256:
        return ShrinkConfig(16, block_r, 128, 32, 4, 3)
    if t_bucket <= 1024:
        return ShrinkConfig(32, block_r, 128, 16, 4, 3)
    return ShrinkConfig(64, block_r, 128, 8, 4, 3)


def default_expand(t_bucket: int, r_bucket: int) -> ExpandConfig:
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


for _tuned in filter(None, os.environ.get("ADAPTERPLANE_LORA_TUNED", "").split(os.pathsep)):
    load_tuned(_tuned)  # e.g. the fused sweep's file, then the folded-SiLU sweep's
