"""Host side of the base projection with the LoRA expand in its epilogue
(``linear_lora_kernel.py``): the segmented shrink into the workspace's ``z``, then one
launch computing ``y = x @ W^T + LoRA`` tile by tile. Decode-sized steps only (the
whole row range in one or a few ``BLOCK_M`` tiles). Measured by ``bench/linear_lora.py``
against cuBLAS + the fused LoRA launch; the engine's LoRA linears take it when the backend
is built with ``linear=True`` (env ``ADAPTERPLANE_LORA_LINEAR=1``, off by default).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from dataplane.intmath import cdiv, next_pow2
from dataplane.kernels.base import LoraBatchMeta, LoraModuleWeights, LoraWorkspace
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.triton import ops
from dataplane.kernels.triton.configs import fused_shape, shrink_config, shrink_entry
from dataplane.kernels.triton.linear_lora_kernel import linear_lora_kernel
from dataplane.triton_launch import LaunchPlan


@dataclass(frozen=True)
class LinearLoraConfig:
    """Tile of the base product (``block_m`` rows x ``block_n`` output columns, K in
    ``block_k`` steps, ``num_stages`` deep); ``pdl``: the launch overlaps the shrink's end
    (Hopper and later)."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1
    pdl: int = 0


def scratch_numel(num_rows: int, out_features: int, cfg: LinearLoraConfig) -> int:
    """fp32 partial-tile floats a call of ``cfg`` over these sizes needs (0 unsplit)."""
    if cfg.split_k == 1:
        return 0
    tiles = cdiv(num_rows, cfg.block_m) * cdiv(out_features, cfg.block_n)
    return tiles * cfg.split_k * cfg.block_m * cfg.block_n


def scratch_bounds(max_rows: int, shapes: list[tuple[int, tuple[int, ...]]]) -> tuple[int, int]:
    """(partial-tile floats, output tiles) any step up to ``max_rows`` rows needs over
    projections of these ``(in_features, out_features)``, with the table's tiles (row
    counts: powers of two and ``max_rows``, capped at ``MAX_ROWS``)."""
    rows = [r for r in (*(1 << i for i in range(9)), max_rows) if r <= min(max_rows, MAX_ROWS)]
    cfgs = [(r, sum(outs), linear_config(r, d_in, outs)) for r in rows for d_in, outs in shapes]
    numel = max((scratch_numel(r, n, c) for r, n, c in cfgs), default=0)
    tiles = max((cdiv(r, c.block_m) * cdiv(n, c.block_n) for r, n, c in cfgs), default=1)
    return numel, tiles


@dataclass(frozen=True)
class LinearScratch:
    """Split-K partial tiles (fp32) and one self-resetting counter per output tile (zero
    between launches; launches sharing them must not overlap: one per stream). The
    engine passes its LoRA workspace's ``tiles`` and ``counters``."""

    buffer: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def allocate(cls, max_rows: int, max_out: int, cfg: LinearLoraConfig,
                 device: torch.device | str) -> LinearScratch:  # fmt: skip
        tiles = cdiv(max_rows, cfg.block_m) * cdiv(max_out, cfg.block_n)
        return cls(torch.empty(max(1, scratch_numel(max_rows, max_out, cfg)),
                               dtype=torch.float32, device=device),
                   torch.zeros(tiles, dtype=torch.int32, device=device))  # fmt: skip


MAX_ROWS = 256
MAX_RANK = 64
# Tile per module shape class (``configs.fused_shape``) at up to 128 rows. First guesses,
# not measured yet: 4 K splits where the output is narrow (q/k/v, o, down: 32-48 column
# tiles of 128 would leave most multiprocessors idle), none for gate/up (112 column tiles
# of 256 x 2 row tiles). Wide column tiles because every column tile re-reads ``x`` (T x K)
# from L2: at 128 rows and 128 columns that is as many bytes as the weight itself.
LINEAR_TABLE: dict[str, LinearLoraConfig] = {
    "square": LinearLoraConfig(128, 128, 128, 8, 3, split_k=4, pdl=1),
    "qkv": LinearLoraConfig(128, 128, 128, 8, 3, split_k=4, pdl=1),
    "deep": LinearLoraConfig(128, 128, 128, 8, 3, split_k=4, pdl=1),
    "wide": LinearLoraConfig(64, 256, 64, 8, 3, split_k=1, pdl=1),
}


def linear_config(num_rows: int, in_features: int,
                  out_features: tuple[int, ...]) -> LinearLoraConfig:  # fmt: skip
    """The module class's tile, with row tiles no taller than the step (at least 16) and
    column tiles halved until they divide every slice (at least 16)."""
    cfg = LINEAR_TABLE[fused_shape(in_features, out_features)]
    block_n = cfg.block_n
    while block_n > 16 and any(w % block_n for w in out_features):
        block_n //= 2
    return replace(cfg, block_m=min(cfg.block_m, max(16, next_pow2(num_rows))), block_n=block_n)


def linear_lora_fits(num_rows: int, weights: LoraModuleWeights, cfg: LinearLoraConfig) -> str:
    """Why this call cannot take the fused projection ("" = it can)."""
    if num_rows > MAX_ROWS:
        return f"{num_rows} rows > {MAX_ROWS}"
    if weights.max_rank > MAX_RANK:
        return f"rank {weights.max_rank} > {MAX_RANK}"
    if any(w % cfg.block_n for w in weights.out_features):
        return f"a slice width is not a multiple of block_n {cfg.block_n}"
    if len(weights.out_features) > ops.MAX_SLICES:
        return f"{len(weights.out_features)} slices > {ops.MAX_SLICES}"
    if shrink_entry(num_rows, weights.max_rank).row_split:
        return "the shrink entry splits by rows"
    return ""


@functools.lru_cache(maxsize=256)
def _plan(cfg: LinearLoraConfig, split: int, target: int, shrink_bm: int, s: int,
          lora: bool, dtype: torch.dtype, device: torch.device,
          specialized: tuple[int, ...]) -> LaunchPlan:  # fmt: skip
    """``specialized``: every integer argument Triton specializes on (all but ``T`` and the
    slice widths): a plan's compiled kernels serve one value of each."""
    pdl = lora and ops.pdl_launch(cfg.pdl, device)
    return LaunchPlan(linear_lora_kernel, dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        S_PAD=ops._s_pad(s), STAGES=cfg.num_stages, SH_BLOCK_M=shrink_bm, SPLIT_MAX=split,
        TARGET=target, LORA=lora, PDL=pdl, UPCAST=ops._interpreting(),
        PREC=ops._precision(dtype), num_warps=cfg.num_warps, **ops.pdl_options(pdl),
    ))  # fmt: skip


def linear_lora(
    x: torch.Tensor,
    weight: torch.Tensor,
    y: torch.Tensor,
    cfg: LinearLoraConfig,
    scratch: LinearScratch,
    meta: LoraBatchMeta | None = None,
    weights: LoraModuleWeights | None = None,
    workspace: LoraWorkspace | None = None,
) -> None:
    """``y = x @ weight^T`` plus, with ``meta``/``weights``/``workspace``, every row's
    adapter delta (``y`` is written, not added to). ``weight``: ``[N, K]``, unit column
    stride, ``x``'s dtype. Checks everything before launching anything."""
    t, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or tuple(y.shape) != (t, n) or weight.stride(1) != 1:
        raise LoraShapeError(f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, "
                             f"y {tuple(y.shape)} do not make y = x @ weight^T")
    grid = (cdiv(n, cfg.block_n) * cfg.split_k, cdiv(t, cfg.block_m))
    if (grid[0] // cfg.split_k * grid[1] > scratch.counters.numel()
            or scratch_numel(t, n, cfg) > scratch.buffer.numel()):
        raise LoraShapeError(f"the scratch is too small for {t} x {n} with {cfg}")
    ints = (x.stride(0), weight.stride(0), y.stride(0))
    if meta is None or weights is None or workspace is None:
        spec = (k, n, 1, 1, 1, *ints)
        plan = _plan(cfg, 1, 1, 16, 1, False, x.dtype, x.device, spec)
        plan(grid, x, weight, y, y, y, y, y, y, y, y, scratch.buffer, scratch.counters,
             t, *spec, n, 0, 0, 0)  # fmt: skip
        return
    why = linear_lora_fits(t, weights, cfg)
    if why or sum(weights.out_features) != n or weights.in_features != k:
        raise LoraShapeError(why or "adapter shapes differ from the projection's")
    ns, r_max = weights.num_slices, weights.max_rank
    shrink = shrink_config(t, r_max, k)
    z = workspace.bottleneck(shrink.split_k, t, ns, r_max)
    ops.launch_shrink(x, weights.storage, weights.a_rows, weights.ranks, meta.sorted_rows,
                      meta.slot_counts, meta.slot_starts, z, weights.addr_align)  # fmt: skip
    widths = (*weights.out_features, 0, 0, 0)[: ops.MAX_SLICES]
    s = weights.ranks.shape[1]
    spec = (k, n, s, ns, r_max, *ints)
    plan = _plan(cfg, shrink.split_k, ops.shrink_target(shrink, x.device), shrink.block_m, s,
                 True, x.dtype, x.device, spec)  # fmt: skip
    plan(grid, x, weight, y, z, weights.storage, weights.b_rows, weights.ranks, weights.scales,
         meta.row_slot, meta.slot_counts, scratch.buffer, scratch.counters,
         t, *spec, *widths)  # fmt: skip


class BaseLinear:
    """``x @ weight^T`` through ``linear_lora`` without adapters, for projections with no
    LoRA branch in a step (env ``ADAPTERPLANE_TRITON_LINEAR=1``; off by default): so that
    an engine without adapters can run the same base product as ``linear_lora`` with them
    (the honest baseline for it), and to compare it with cuBLAS. Owns its split-K scratch,
    sized once for every projection shape of the model."""

    def __init__(self, max_rows: int, shapes: list[tuple[int, tuple[int, ...]]],
                 device: torch.device) -> None:  # fmt: skip
        numel, tiles = scratch_bounds(max_rows, shapes)
        self.scratch = LinearScratch(
            torch.empty(max(1, numel), dtype=torch.float32, device=device),
            torch.zeros(tiles, dtype=torch.int32, device=device))  # fmt: skip
        self.shapes = {(d_in, sum(outs)): outs for d_in, outs in shapes}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """The product, or None where it does not apply (rows, shape, layout)."""
        t, k = x.shape
        outs = self.shapes.get((k, weight.shape[0]))
        if (outs is None or t == 0 or t > MAX_ROWS or x.stride(1) != 1 or weight.stride(1) != 1
                or weight.dtype != x.dtype):  # fmt: skip
            return None
        cfg = linear_config(t, k, outs)
        if any(w % cfg.block_n for w in outs):
            return None
        y = torch.empty(t, weight.shape[0], dtype=x.dtype, device=x.device)
        linear_lora(x, weight, y, cfg, self.scratch)
        return y
