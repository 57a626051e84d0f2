"""Launch wrapper and torch custom op for the fused decode kernel.

``adapterplane::lora_fused`` mutates ``y`` (the delta), ``scratch`` (split-K
partials) and ``counters`` (each launch adds whole epochs, see ``fused_kernel``); its fake
implementation does nothing. The grid depends only on static shapes, so the
launch is captured in a CUDA graph like the two-kernel path.
"""

from __future__ import annotations

import functools

import torch

from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.triton.configs import FusedConfig, fused_config
from dataplane.kernels.triton.fused_kernel import fused_block_n, fused_block_r, lora_fused_kernel
from dataplane.kernels.triton.ops import (
    MAX_SLICES,
    _interpreting,
    _precision,
    _s_pad,
    max_tiles,
    pdl_launch,
    pdl_options,
)
from dataplane.triton_launch import LaunchPlan, sm_count

# Most programs a fused launch may use (sizes the scratch it needs).
FUSED_MAX_PROGRAMS = 2048


def fused_target(device: torch.device, cfg: FusedConfig) -> int:
    """Live-program bound for the device's split choice (16 off CUDA)."""
    if device.type != "cuda":
        return 16
    sms = sm_count(device)
    return min(FUSED_MAX_PROGRAMS, cfg.per_sm * sms)


def fused_min_split(cfg: FusedConfig) -> int:
    """K splits the device never goes below (1 under the interpreter)."""
    return 1 if _interpreting() else max(1, min(cfg.min_split, cfg.split_k))


def weighted(cfg: FusedConfig) -> bool:
    """Slices get items by their factor bytes (never under the interpreter, whose
    programs run one after another: a split may not wait for another)."""
    return bool(cfg.weighted) and not _interpreting()


def slice_items(cfg: FusedConfig, eff: int, in_features: int,
                out_features: tuple[int, ...]) -> int:
    """Items per live row tile at ``eff`` splits (the kernel's ``_per_tile``)."""
    if not weighted(cfg):
        return eff * len(out_features)
    k, w_min = in_features, min(out_features)
    return sum(max(1, (eff * (k + w) * 2 + k + w_min) // (2 * (k + w_min)))
               for w in out_features)


def fused_programs(tiles: int, cfg: FusedConfig, device: torch.device, in_features: int,
                   out_features: tuple[int, ...]) -> int:
    """The grid of a launch with at most ``tiles`` row tiles: the ``per_sm``
    bound, raised to the items at ``min_split`` when that is more (so every
    item has its own program; only the interpreter's programs loop)."""
    items = tiles * slice_items(cfg, fused_min_split(cfg), in_features, out_features)
    return max(fused_target(device, cfg), items)


def fused_scratch_numel(programs: int, max_rank: int, block_m: int = 16) -> int:
    return programs * block_m * fused_block_r(max_rank)


def fused_fits(
    num_rows: int,
    num_slots: int,
    in_features: int,
    out_features: tuple[int, ...],
    max_rank: int,
    cfg: FusedConfig,
    scratch_numel: int,
    counters: int,
    device: torch.device,
) -> bool:
    """Whether a fused launch fits the workspace (else the caller uses two kernels):
    every item of the worst case (every slot live) gets a program, within
    ``FUSED_MAX_PROGRAMS``, the scratch and the counters. Whether it is faster than
    two kernels is the table's business (``min_split = 1`` lets many live slots run
    unsplit: q/k/v with 50 live slots is faster unsplit than with 2 splits).
    """
    tiles = max_tiles(num_rows, num_slots, cfg.block_m)
    num_slices = len(out_features)
    programs = fused_programs(tiles, cfg, device, in_features, out_features)
    return (
        num_slices <= MAX_SLICES
        and tiles * num_slices <= counters
        and programs <= FUSED_MAX_PROGRAMS
        and fused_scratch_numel(programs, max_rank, cfg.block_m) <= scratch_numel
    )


def fused_block_k(cfg: FusedConfig, block_r: int, elem_bytes: int) -> int:
    """``cfg.block_k`` halved until the pipelined shrink tiles fit shared memory.

    Triton buffers ``num_stages - 1`` copies of the ``A`` and ``x`` tiles (fp32,
    rank 128, ``BLOCK_K`` 256 needs exactly 2 x (256 x 128 + 16 x 256) x 4 =
    294,912 bytes, over the H200's limit of 232,448); 200,000 leaves room for the
    expand's operands.
    """
    bk = cfg.block_k
    stages = max(1, cfg.num_stages - 1)
    while bk > 32 and stages * (bk * block_r + cfg.block_m * bk) * elem_bytes > 200_000:
        bk //= 2
    return bk


def launch_fused(
    y: torch.Tensor,
    x: torch.Tensor,
    storage: torch.Tensor,
    a_rows: torch.Tensor,
    b_rows: torch.Tensor,
    ranks: torch.Tensor,
    scales: torch.Tensor,
    sorted_rows: torch.Tensor,
    slot_counts: torch.Tensor,
    slot_starts: torch.Tensor,
    scratch: torch.Tensor,
    counters: torch.Tensor,
    out_features: list[int],
    align: int,
) -> None:
    """``y[:, slice k] += scale * (x @ A^T) @ Bt`` for every slice, one launch."""
    plan, grid, ints = prepare_fused(x, y, a_rows, scratch, counters, out_features, align)
    plan(grid, x, y, storage, a_rows, b_rows, ranks, scales, scratch, counters, sorted_rows,
         slot_counts, slot_starts, *ints)


def prepare_fused(x: torch.Tensor, y: torch.Tensor, a_rows: torch.Tensor,
                  scratch: torch.Tensor, counters: torch.Tensor,
                  out_features: list[int] | tuple[int, ...],
                  align: int) -> tuple[LaunchPlan, tuple[int, ...], tuple[int, ...]]:
    """(plan, grid, integer arguments) of a fused launch (checks scratch and counters)."""
    t, k = x.shape
    ns, s, r_max = a_rows.shape
    cfg = fused_config(t, r_max, k, tuple(out_features))
    if cfg is None:
        raise LoraShapeError(f"no fused config for T={t}, rank {r_max}")
    tiles = max_tiles(t, s, cfg.block_m)
    programs = fused_programs(tiles, cfg, x.device, k, tuple(out_features))
    if scratch.numel() < fused_scratch_numel(programs, r_max, cfg.block_m):
        raise LoraShapeError("fused scratch too small")
    if tiles * ns > counters.numel():
        raise LoraShapeError("too few fused counters")
    widths = (*out_features, 0, 0, 0)[:MAX_SLICES]
    ints = (s, k, ns, r_max, x.stride(0), y.stride(0), fused_target(x.device, cfg))
    plan = _plan(cfg, widths, ints[:-1], x.dtype, x.element_size(), align, x.device)
    return plan, (programs,), ints


@functools.lru_cache(maxsize=256)
def _plan(cfg: FusedConfig, widths: tuple[int, ...], ints: tuple[int, ...], dtype: torch.dtype,
          elem: int, align: int, device: torch.device) -> LaunchPlan:
    """One plan per config, slice widths and specialized integers (TARGET is not)."""
    r_max = ints[3]
    block_r = fused_block_r(r_max)
    pdl = pdl_launch(cfg.pdl, device)
    return LaunchPlan(lora_fused_kernel, dict(
        W0=widths[0], W1=widths[1], W2=widths[2], W3=widths[3],
        BLOCK_M=cfg.block_m, BLOCK_R=block_r, BLOCK_N=fused_block_n(block_r, cfg.n_elems),
        BLOCK_K=fused_block_k(cfg, block_r, elem),
        # the interpreter runs programs serially: no split may wait for another
        SPLIT_MAX=1 if _interpreting() else cfg.split_k, MIN_SPLIT=fused_min_split(cfg),
        S_PAD=_s_pad(ints[0]), ALIGN=align,
        UPCAST=_interpreting(), PREC=_precision(dtype), PIPE=cfg.pipe, PDL=pdl,
        WEIGHTED=weighted(cfg), WMIN=min(w for w in widths if w),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_options(pdl),
    ))  # fmt: skip


# The launcher itself is the op (same signature); its fake does nothing.
lora_fused = torch.library.custom_op("adapterplane::lora_fused", launch_fused,
                                     mutates_args=("y", "scratch", "counters"))


@lora_fused.register_fake
def _lora_fused_fake(*args: object) -> None:
    return None
