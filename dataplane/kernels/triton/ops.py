"""Launch wrappers for the Triton kernels, registered as torch custom ops.

``adapterplane::lora_shrink`` and ``adapterplane::lora_expand`` mutate their
output argument and return nothing; their fake implementations do nothing, so
``torch.compile`` traces through them and CUDA graphs capture the launches
(grids depend only on static shapes). Configs come from ``configs.py`` keyed by
the static shapes, so the op signature carries tensors only.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

import torch

from dataplane.intmath import cdiv, next_pow2
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.triton.configs import (
    ExpandConfig,
    ShrinkConfig,
    expand_config,
    fit_shrink_smem,
    shrink_config,
    shrink_entry,
)
from dataplane.kernels.triton.expand_kernel import lora_expand_kernel
from dataplane.kernels.triton.lora_kernels import lora_shrink_kernel
from dataplane.triton_launch import LaunchPlan, sm_count

MAX_SLICES = 4


@functools.cache
def _interpreting() -> bool:
    """Triton reads ``TRITON_INTERPRET`` when it decorates the kernels (at import), so
    the launchers read it once too (an environment lookup per launch costs µs)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _precision(dtype: torch.dtype) -> str:
    # fp32 factors: exact fp32 products (tf32 would cost ~1e-3 relative error).
    return "ieee" if dtype == torch.float32 or _interpreting() else "tf32"


def _s_pad(num_slots: int) -> int:
    return max(16, next_pow2(num_slots))


def split_target(device: torch.device, per_sm: int = 2) -> int:
    """Programs the dynamic split-K aims for: ``per_sm`` per multiprocessor
    (``8 * per_sm`` under the interpreter, so tests exercise several splits)."""
    if device.type != "cuda":
        return 8 * per_sm
    return per_sm * sm_count(device)


def shrink_target(cfg: ShrinkConfig, device: torch.device) -> int:
    """``TARGET`` of a two-kernel shrink with ``cfg``; the expand reading its
    ``z`` must pass the same value to derive the same number of splits."""
    return split_target(device, cfg.per_sm)


def pdl_launch(flag: int, device: torch.device) -> bool:
    """Launch as a programmatic dependent launch: asked by the config, on CUDA with
    compute capability 9.0 or later, never under the interpreter. The kernel's blocks are
    scheduled while the previous kernel in the stream drains; they wait for it
    (``gdc_wait``) before reading anything it may have written."""
    if not flag or _interpreting() or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_options(on: bool) -> dict[str, bool]:
    """Launch options of a plan (``launch_pdl`` only when on)."""
    return {"launch_pdl": True} if on else {}


def max_tiles(num_rows: int, num_slots: int, block_m: int) -> int:
    """Static grid bound on (slot, row-tile) pairs: each slot adds <= 1 partial tile."""
    return cdiv(num_rows, block_m) + min(num_slots, num_rows)


def shrink_pack(cfg: ShrinkConfig, ns: int, r_max: int) -> int:
    """Slices one shrink program covers (``next_pow2(ns)``), or 0: one per slice."""
    slices = next_pow2(ns)
    fits = ns > 1 and r_max <= cfg.block_r and slices * cfg.block_r <= cfg.pack
    return slices if fits else 0


@functools.lru_cache(maxsize=512)
def _shrink_plan(cfg: ShrinkConfig, s: int, k: int, ns: int, r_max: int, stride: int,
                 dtype: torch.dtype, elem: int, align: int, device: torch.device) -> LaunchPlan:
    """The launch of ``cfg`` for these specialized arguments (T is not specialized)."""
    target = shrink_target(cfg, device)
    pack = shrink_pack(cfg, ns, r_max)
    fit = fit_shrink_smem(replace(cfg, block_r=cfg.block_r * max(1, pack)), elem)
    pdl = pdl_launch(cfg.pdl, device)
    return LaunchPlan(lora_shrink_kernel, dict(
        BLOCK_M=fit.block_m, BLOCK_R=fit.block_r, BLOCK_K=fit.block_k,
        SPLIT_MAX=cfg.split_k, TARGET=target,
        S_PAD=_s_pad(s), ALIGN=align, UPCAST=_interpreting(), PREC=_precision(dtype),
        EVICT_X=fit.evict_x, ROW_SPLIT=cfg.row_split, PDL=pdl, PACK=pack,
        num_warps=fit.num_warps, num_stages=fit.num_stages, **pdl_options(pdl),
    ))  # fmt: skip


def prepare_shrink(x: torch.Tensor, ranks: torch.Tensor, z: torch.Tensor,
                   align: int) -> tuple[LaunchPlan, tuple[int, ...], tuple[int, ...]]:
    """(plan, grid, integer arguments) of a shrink of ``x`` into ``z``."""
    split, t, ns, r_max = z.shape
    s = ranks.shape[1]
    k = x.shape[1]
    cfg = shrink_config(t, r_max, k)
    if cfg.split_k != split:
        raise LoraShapeError(f"z has {split} splits, the config table wants {cfg.split_k}")
    stride = x.stride(0)
    plan = _shrink_plan(cfg, s, k, ns, r_max, stride, x.dtype, x.element_size(), align,
                        x.device)
    grid = (max_tiles(t, s, cfg.block_m), split, 1 if shrink_pack(cfg, ns, r_max) else ns)
    return plan, grid, (s, k, t, ns, r_max, stride)


def launch_shrink(
    x: torch.Tensor,
    storage: torch.Tensor,
    a_rows: torch.Tensor,
    ranks: torch.Tensor,
    sorted_rows: torch.Tensor,
    slot_counts: torch.Tensor,
    slot_starts: torch.Tensor,
    z: torch.Tensor,
    align: int,
) -> None:
    """``z [split, T, NS, R]`` fp32 partials of ``x [T, d_in] @ A^T`` per slice.

    ``align``: every row address (and slice width) is a multiple of it.
    """
    plan, grid, ints = prepare_shrink(x, ranks, z, align)
    plan(grid, x, storage, a_rows, ranks, z, sorted_rows, slot_counts, slot_starts, *ints)


@functools.lru_cache(maxsize=512)
def _expand_plan(cfg: ExpandConfig, shrink_cfg: ShrinkConfig, split: int, s: int, ns: int,
                 r_max: int, stride: int, widths: tuple[int, ...], dtype: torch.dtype,
                 align: int, device: torch.device) -> LaunchPlan:
    pdl = pdl_launch(cfg.pdl, device)
    return LaunchPlan(lora_expand_kernel, dict(
        W0=widths[0], W1=widths[1], W2=widths[2], W3=widths[3],
        SPLIT_MAX=split, TARGET=shrink_target(shrink_cfg, device),
        SHRINK_BM=shrink_cfg.block_m,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, N_ITERS=cfg.n_iters,
        BLOCK_R=cfg.block_r,
        S_PAD=_s_pad(s), ALIGN=align, UPCAST=_interpreting(), PREC=_precision(dtype),
        Y_PREFETCH=cfg.y_prefetch, ROW_SPLIT=shrink_cfg.row_split, PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_options(pdl),
    ))  # fmt: skip


def prepare_expand(y: torch.Tensor, z: torch.Tensor, ranks: torch.Tensor,
                   out_features: list[int] | tuple[int, ...],
                   align: int) -> tuple[LaunchPlan, tuple[int, ...], tuple[int, ...]]:
    """(plan, grid, integer arguments) of an expand of ``z`` into ``y``."""
    split, t, ns, r_max = z.shape
    s = ranks.shape[1]
    cfg = expand_config(t, r_max)
    shrink_cfg = shrink_entry(t, r_max)  # block_m and per_sm do not depend on K
    widths = (*out_features, 0, 0, 0)[:MAX_SLICES]
    stride = y.stride(0)
    plan = _expand_plan(cfg, shrink_cfg, split, s, ns, r_max, stride, widths, y.dtype, align,
                        y.device)
    n_tiles = sum(cdiv(w, cfg.block_n * cfg.n_iters) for w in out_features)
    return plan, (max_tiles(t, s, cfg.block_m), n_tiles), (s, t, ns, r_max, stride)


def launch_expand(
    y: torch.Tensor,
    z: torch.Tensor,
    storage: torch.Tensor,
    b_rows: torch.Tensor,
    ranks: torch.Tensor,
    scales: torch.Tensor,
    sorted_rows: torch.Tensor,
    slot_counts: torch.Tensor,
    slot_starts: torch.Tensor,
    out_features: list[int],
    align: int,
) -> None:
    """``y[:, slice k] += scale * sum_split(z) @ Bt`` for every slice, in place."""
    plan, grid, ints = prepare_expand(y, z, ranks, out_features, align)
    plan(grid, y, z, storage, b_rows, ranks, scales, sorted_rows, slot_counts, slot_starts,
         *ints)


# The launchers themselves are the ops (same signatures); their fakes do nothing (the
# outputs are mutated arguments), so torch.compile traces through them.
lora_shrink = torch.library.custom_op("adapterplane::lora_shrink", launch_shrink,
                                      mutates_args=("z",))
lora_expand = torch.library.custom_op("adapterplane::lora_expand", launch_expand,
                                      mutates_args=("y",))


@lora_shrink.register_fake
def _lora_shrink_fake(*args: object) -> None:
    return None


@lora_expand.register_fake
def _lora_expand_fake(*args: object) -> None:
    return None
