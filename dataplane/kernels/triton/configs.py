"""Tile configurations per shape class, tuned offline on the H200.

Shape class = (bucket of T, the rows in the step; bucket of R, the module's
physical rank). Decode steps have small T (one row per request), prefill steps
large T; ``T`` is static for a captured graph, so the choice costs nothing per
step. ``bench/lora_kernels.py --tune`` times the candidates in
``SHRINK_CANDIDATES`` / ``EXPAND_CANDIDATES`` on the device and prints the
winning table, which is pasted into ``SHRINK_TABLE`` / ``EXPAND_TABLE``.
"""

from __future__ import annotations

from dataclasses import dataclass

T_BUCKETS = (16, 64, 256, 1024, 4096, 1 << 30)
R_BUCKETS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class ShrinkConfig:
    """``z = x @ A^T`` tiles: rows × rank × K; ``split_k`` partial sums over K."""

    block_m: int
    block_r: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class ExpandConfig:
    """``y += s z @ Bt`` tiles: rows × output columns × rank chunk."""

    block_m: int
    block_n: int
    block_r: int
    num_warps: int
    num_stages: int


def bucket(value: int, edges: tuple[int, ...]) -> int:
    for edge in edges:
        if value <= edge:
            return edge
    return edges[-1]


# Filled from `bench/lora_kernels.py --tune` on the H200 (see docs/PERFORMANCE.md).
# Keys: (T bucket, R bucket). Entries missing here fall back to `default_*`.
SHRINK_TABLE: dict[tuple[int, int], ShrinkConfig] = {}
EXPAND_TABLE: dict[tuple[int, int], ExpandConfig] = {}


def default_shrink(t_bucket: int, r_bucket: int) -> ShrinkConfig:
    block_r = min(r_bucket, 64)
    if t_bucket <= 64:
        return ShrinkConfig(16, block_r, 128, 16, 4, 3)
    if t_bucket <= 256:
        return ShrinkConfig(16, block_r, 128, 8, 4, 3)
    if t_bucket <= 1024:
        return ShrinkConfig(32, block_r, 128, 4, 4, 3)
    return ShrinkConfig(64, block_r, 64, 2, 4, 3)


def default_expand(t_bucket: int, r_bucket: int) -> ExpandConfig:
    block_r = min(r_bucket, 64)
    if t_bucket <= 256:
        return ExpandConfig(16, 128, block_r, 4, 2)
    if t_bucket <= 1024:
        return ExpandConfig(32, 128, block_r, 4, 2)
    return ExpandConfig(64, 128, block_r, 4, 2)


def shrink_config(num_rows: int, max_rank: int, in_features: int) -> ShrinkConfig:
    """Config for a shrink over ``num_rows`` rows; split-K capped so every split
    has at least one K tile."""
    key = (bucket(num_rows, T_BUCKETS), bucket(max_rank, R_BUCKETS))
    cfg = SHRINK_TABLE.get(key) or default_shrink(*key)
    k_tiles = max(1, -(-in_features // cfg.block_k))
    split = min(cfg.split_k, k_tiles)
    block_r = min(cfg.block_r, max(16, key[1]))
    if split != cfg.split_k or block_r != cfg.block_r:
        cfg = ShrinkConfig(cfg.block_m, block_r, cfg.block_k, split, cfg.num_warps, cfg.num_stages)
    return cfg


def expand_config(num_rows: int, max_rank: int) -> ExpandConfig:
    key = (bucket(num_rows, T_BUCKETS), bucket(max_rank, R_BUCKETS))
    cfg = EXPAND_TABLE.get(key) or default_expand(*key)
    block_r = min(cfg.block_r, max(16, key[1]))
    if block_r != cfg.block_r:
        cfg = ExpandConfig(cfg.block_m, cfg.block_n, block_r, cfg.num_warps, cfg.num_stages)
    return cfg


def max_split_k() -> int:
    """Largest split any table entry uses (sizes the workspace)."""
    splits = [c.split_k for c in SHRINK_TABLE.values()]
    splits += [default_shrink(t, r).split_k for t in T_BUCKETS for r in R_BUCKETS]
    return max(splits)
