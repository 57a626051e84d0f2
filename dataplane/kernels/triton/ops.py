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

import torch

from dataplane.intmath import cdiv, next_pow2
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.triton.configs import (
    ShrinkConfig,
    expand_config,
    fit_shrink_smem,
    shrink_config,
    shrink_entry,
)
from dataplane.kernels.triton.expand_kernel import lora_expand_kernel
from dataplane.kernels.triton.lora_kernels import lora_shrink_kernel

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
    return per_sm * _sm_count(device.index if device.index is not None else 0)


def shrink_target(cfg: ShrinkConfig, device: torch.device) -> int:
    """``TARGET`` of a two-kernel shrink with ``cfg``; the expand reading its
    ``z`` must pass the same value to derive the same number of splits."""
    return split_target(device, cfg.per_sm)


@functools.cache
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def max_tiles(num_rows: int, num_slots: int, block_m: int) -> int:
    """Static grid bound on (slot, row-tile) pairs: each slot adds <= 1 partial tile."""
    return cdiv(num_rows, block_m) + min(num_slots, num_rows)


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
    split, t, ns, r_max = z.shape
    s = ranks.shape[1]
    k = x.shape[1]
    cfg = shrink_config(t, r_max, k)
    if cfg.split_k != split:
        raise LoraShapeError(f"z has {split} splits, the config table wants {cfg.split_k}")
    target = shrink_target(cfg, x.device)
    cfg = fit_shrink_smem(cfg, x.element_size())
    grid = (max_tiles(t, s, cfg.block_m), split, ns)
    lora_shrink_kernel[grid](
        x, storage, a_rows, ranks, z, sorted_rows, slot_counts, slot_starts,
        s, k, t, ns, r_max, x.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k,
        SPLIT_MAX=split, TARGET=target,
        S_PAD=_s_pad(s), ALIGN=align, UPCAST=_interpreting(), PREC=_precision(x.dtype),
        EVICT_X=cfg.evict_x, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


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
    split, t, ns, r_max = z.shape
    s = ranks.shape[1]
    cfg = expand_config(t, r_max)
    shrink_cfg = shrink_entry(t, r_max)  # block_m and per_sm do not depend on K
    widths = [*out_features, 0, 0, 0][:MAX_SLICES]
    n_tiles = sum(cdiv(w, cfg.block_n * cfg.n_iters) for w in out_features)
    grid = (max_tiles(t, s, cfg.block_m), n_tiles)
    lora_expand_kernel[grid](
        y, z, storage, b_rows, ranks, scales, sorted_rows, slot_counts, slot_starts,
        s, t, ns, r_max, y.stride(0), widths[0], widths[1], widths[2], widths[3],
        SPLIT_MAX=split, TARGET=shrink_target(shrink_cfg, y.device),
        SHRINK_BM=shrink_cfg.block_m,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, N_ITERS=cfg.n_iters,
        BLOCK_R=cfg.block_r,
        S_PAD=_s_pad(s), ALIGN=align, UPCAST=_interpreting(), PREC=_precision(y.dtype),
        Y_PREFETCH=cfg.y_prefetch, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


@torch.library.custom_op("adapterplane::lora_shrink", mutates_args=("z",))
def lora_shrink(
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
    launch_shrink(x, storage, a_rows, ranks, sorted_rows, slot_counts, slot_starts, z, align)


@lora_shrink.register_fake
def _lora_shrink_fake(
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
    return None


@torch.library.custom_op("adapterplane::lora_expand", mutates_args=("y",))
def lora_expand(
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
    launch_expand(
        y, z, storage, b_rows, ranks, scales, sorted_rows, slot_counts, slot_starts, out_features,
        align,
    )  # fmt: skip


@lora_expand.register_fake
def _lora_expand_fake(
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
    return None
