"""Launcher of the gate/up expand folded into SiLU·mul (``expand_silu_kernel.py``),
registered as the torch custom op ``adapterplane::lora_expand_silu`` (mutates ``out``)."""

from __future__ import annotations

import functools

import torch

from dataplane.intmath import cdiv
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.triton.configs import ExpandConfig, ShrinkConfig, shrink_entry, silu_config
from dataplane.kernels.triton.expand_silu_kernel import grid_rows, lora_expand_silu_kernel
from dataplane.kernels.triton.ops import (
    _interpreting,
    _precision,
    _s_pad,
    pdl_launch,
    pdl_options,
    shrink_target,
)
from dataplane.triton_launch import LaunchPlan


def prepare_expand_silu(gate_up: torch.Tensor, out: torch.Tensor, z: torch.Tensor,
                        ranks: torch.Tensor,
                        align: int) -> tuple[LaunchPlan, tuple[int, ...], tuple[int, ...]]:
    """(plan, grid, integer arguments) of the folded expand of ``z`` into ``out``."""
    split, t, _, r_max = z.shape
    s = ranks.shape[1]
    inter = out.shape[1]
    cfg = silu_config(t, r_max)
    if cfg is None:
        raise LoraShapeError(f"no folded gate/up config for T={t}")
    shrink_cfg = shrink_entry(t, r_max)  # block_m and per_sm do not depend on K
    plan = _plan(cfg, shrink_cfg, split, s, r_max, gate_up.stride(0), out.stride(0), inter,
                 out.dtype, align, out.device)
    grid = (grid_rows(t, s, cfg.block_m), cdiv(inter, cfg.block_n * cfg.n_iters))
    return plan, grid, (s, t, r_max, gate_up.stride(0), out.stride(0))


def launch_expand_silu(
    gate_up: torch.Tensor,
    out: torch.Tensor,
    z: torch.Tensor,
    storage: torch.Tensor,
    b_rows: torch.Tensor,
    ranks: torch.Tensor,
    scales: torch.Tensor,
    sorted_rows: torch.Tensor,
    slot_counts: torch.Tensor,
    slot_starts: torch.Tensor,
    align: int,
) -> None:
    """``out = silu(gate + Δgate) * (up + Δup)``; ``z`` from the two-kernel shrink."""
    if z.shape[1] == 0 or out.shape[1] == 0:
        return
    plan, grid, ints = prepare_expand_silu(gate_up, out, z, ranks, align)
    plan(grid, gate_up, out, z, storage, b_rows, ranks, scales, sorted_rows, slot_counts,
         slot_starts, *ints)


@functools.lru_cache(maxsize=256)
def _plan(cfg: ExpandConfig, shrink_cfg: ShrinkConfig, split: int, s: int, r_max: int,
          stride_in: int, stride_out: int, inter: int, dtype: torch.dtype, align: int,
          device: torch.device) -> LaunchPlan:
    pdl = pdl_launch(cfg.pdl, device)
    return LaunchPlan(lora_expand_silu_kernel, dict(
        INTER=inter, SPLIT_MAX=split, TARGET=shrink_target(shrink_cfg, device),
        SHRINK_BM=shrink_cfg.block_m, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        N_ITERS=cfg.n_iters, BLOCK_R=cfg.block_r, S_PAD=_s_pad(s), ALIGN=align,
        UPCAST=_interpreting(), PREC=_precision(dtype), ROW_SPLIT=shrink_cfg.row_split,
        PDL=pdl, PREFETCH=cfg.y_prefetch, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl_options(pdl),
    ))  # fmt: skip


# The launcher itself is the op (same signature); its fake does nothing (mutates ``out``).
lora_expand_silu = torch.library.custom_op(
    "adapterplane::lora_expand_silu", launch_expand_silu, mutates_args=("out",)
)


@lora_expand_silu.register_fake
def _lora_expand_silu_fake(*args: object) -> None:
    return None
