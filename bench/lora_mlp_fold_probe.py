# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Could the MLP's LoRA take two launches instead of three? A probe.

A decode step's MLP with LoRA runs today: gate/up GEMM → fused gate/up LoRA launch →
SiLU·mul → down GEMM → fused down LoRA launch (shrink over 14,336 inputs, split-K
exchange, expand). The fold measured here:

1. ``gate/up + SiLU + down shrink``: one launch whose items are (row tile, split): the
   gate/up shrink split over K with the usual exchange, then each item expands *its share
   of the columns of both gate and up*, applies SiLU·mul and stores ``act``, and — since
   those ``act`` columns are a K range of the down projection's input — accumulates the
   down shrink's partial ``act[:, share] @ A_down[:, share]ᵀ`` and stores it (no second
   exchange);
2. down GEMM on ``act``;
3. ``down expand``: sums the partials in split order and adds ``scale · z @ B_downᵀ``.

The SiLU·mul launch and the down launch's shrink and exchange go away; the gate/up launch
also streams ``A_down``. ``rowfold``: today's gate/up launch, then SiLU·mul whose (row,
column block) programs also store the row's down-shrink partial over the block, the down
GEMM, and launch 3 summing those partials. Llama-8B MLP (4,096 → 2 × 14,336 → 4,096),
T = 128 decode rows over 16 / 50 rank-16 slots, a ring of layers (base weights and factors
stream from HBM), CUDA-graph replay, µs per layer:

- ``base``: gate/up GEMM + SiLU·mul + down GEMM (no LoRA);
- ``today``: base + the two fused LoRA launches (`lora_fused`, the committed tables);
- ``fold``: gate/up GEMM + launch 1 + down GEMM + launch 3, best of a few tiles;
- ``rowfold``: gate/up GEMM + today's gate/up launch + SiLU·mul with row partials + down
  GEMM + launch 3, best of a few tiles.

Rows of the probe all have an adapter (the engine would also need tiles for rows without
one: SiLU·mul only). Every fold variant is checked against today's path first (``act``
and the down output); ``--smoke`` on CPU runs that check only, under
``TRITON_INTERPRET=1`` (one split: the interpreter runs programs one after another).

    python3 bench/lora_mlp_fold_probe.py --out $OUT
    TRITON_INTERPRET=1 python3 bench/lora_mlp_fold_probe.py --smoke
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_anatomy import in_order
from bench.lora_cases import DT, Layer, Scenario
from bench.lora_timing import graph_time_us, probe_parser
from dataplane.intmath import next_pow2
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.kernels.triton.lora_kernels import _shrink_chunk
from dataplane.ops import silu_and_mul

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _eff(counts_ptr, S, BLOCK_M: tl.constexpr, S_PAD: tl.constexpr, SPLIT_MAX: tl.constexpr,
         TARGET: tl.constexpr):  # fmt: skip
    """(tiles per slot, cumulative tiles, live tiles, splits): the largest power of two
    ``<= SPLIT_MAX`` with ``tiles * splits <= TARGET`` (both launches derive the same)."""
    cols = tl.arange(0, S_PAD)
    counts = tl.load(counts_ptr + cols, mask=cols < S, other=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    n_tiles = tl.sum(tiles, axis=0)
    eff = n_tiles * 0 + 1
    for _ in tl.static_range(8):
        ok = (eff * 2 <= SPLIT_MAX) & (n_tiles * eff * 2 <= TARGET)
        eff = tl.where(ok, eff * 2, eff)
    return tiles, tl.cumsum(tiles, axis=0), n_tiles, eff


@triton.jit
def _locate(pid, tiles, cum, S_PAD: tl.constexpr):
    cols = tl.arange(0, S_PAD)
    slot = tl.sum((cum <= pid).to(tl.int32), axis=0)
    tile = pid - tl.sum(tl.where(cols < slot, tiles, 0), axis=0)
    return slot, tile


@triton.jit
def _gate_up_silu_shrink_kernel(
    x_ptr, y_ptr, act_ptr, zd_ptr, st_gu, a_gu, b_gu, ranks_gu, scales_gu, st_d, a_d, ranks_d,
    ws_ptr, ctr_ptr, sorted_ptr, counts_ptr, starts_ptr, S, K, R_GU, R_D, T,
    INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_MAX: tl.constexpr,
    TARGET: tl.constexpr, S_PAD: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    tiles, cum, n_tiles, eff = _eff(counts_ptr, S, BLOCK_M, S_PAD, SPLIT_MAX, TARGET)
    r = tl.arange(0, BLOCK_R)
    loc = tl.arange(0, BLOCK_M)[:, None] * BLOCK_R + r[None, :]
    for p in range(tl.program_id(0), n_tiles * eff, tl.num_programs(0)):
        pid = p // eff
        sp = p - pid * eff
        slot, tile = _locate(pid, tiles, cum, S_PAD)
        ag = tl.load(a_gu + slot * R_GU + r, mask=r < R_GU, other=0)
        au = tl.load(a_gu + (S + slot) * R_GU + r, mask=r < R_GU, other=0)
        bg = tl.load(b_gu + slot * R_GU + r, mask=r < R_GU, other=0)
        bu = tl.load(b_gu + (S + slot) * R_GU + r, mask=r < R_GU, other=0)
        ad = tl.load(a_d + slot * R_D + r, mask=r < R_D, other=0)
        rg = tl.load(ranks_gu + slot)
        ru = tl.load(ranks_gu + S + slot)
        rd = tl.load(ranks_d + slot)
        sg = tl.load(scales_gu + slot)
        su = tl.load(scales_gu + S + slot)
        count = tl.load(counts_ptr + slot)
        start = tl.load(starts_ptr + slot)
        m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < count
        rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
        k_per = tl.cdiv(tl.cdiv(K, BLOCK_K), eff) * BLOCK_K
        zg = _shrink_chunk(x_ptr, st_gu, rows, mmask, ag, r < rg, sp * k_per, K, k_per, K,
                           BLOCK_M, BLOCK_R, BLOCK_K, UPCAST, "ieee", False)  # fmt: skip
        zu = _shrink_chunk(x_ptr, st_gu, rows, mmask, au, r < ru, sp * k_per, K, k_per, K,
                           BLOCK_M, BLOCK_R, BLOCK_K, UPCAST, "ieee", False)  # fmt: skip
        if eff > 1:  # publish both partials, wait for the tile's eff items, sum in order
            tl.store(ws_ptr + (2 * p) * (BLOCK_M * BLOCK_R) + loc, zg)
            tl.store(ws_ptr + (2 * p + 1) * (BLOCK_M * BLOCK_R) + loc, zu)
            tl.debug_barrier()
            cnt = tl.atomic_add(ctr_ptr + pid, 1, sem="acq_rel", scope="gpu") + 1
            while cnt < eff:
                cnt = tl.atomic_add(ctr_ptr + pid, 0, sem="acquire", scope="gpu")
            tl.debug_barrier()
            left = tl.atomic_add(ctr_ptr + 4096 + pid, 1, sem="relaxed", scope="gpu")
            zg = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
            zu = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
            for s in range(0, eff):
                q = 2 * (pid * eff + s)
                zg += tl.load(ws_ptr + q * (BLOCK_M * BLOCK_R) + loc, cache_modifier=".cg")
                zu += tl.load(ws_ptr + (q + 1) * (BLOCK_M * BLOCK_R) + loc, cache_modifier=".cg")
            if left == eff - 1:  # the last to leave resets both counters
                tl.atomic_xchg(ctr_ptr + pid, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(ctr_ptr + 4096 + pid, 0, sem="relaxed", scope="gpu")
        if not UPCAST:
            zg = zg.to(st_gu.dtype.element_ty)
            zu = zu.to(st_gu.dtype.element_ty)
        n_t = tl.cdiv(INTER, BLOCK_N)
        per = tl.cdiv(n_t, eff)
        j0 = sp * per
        j1 = tl.minimum(j0 + per, n_t)
        zd = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
        yrow = y_ptr + rows[:, None] * (2 * INTER)
        for j in range(j0, j1):
            n = j * BLOCK_N + tl.arange(0, BLOCK_N)
            nok = n < INTER
            ym = mmask[:, None] & nok[None, :]
            yg = tl.load(yrow + n[None, :], mask=ym, other=0.0)
            yu = tl.load(yrow + INTER + n[None, :], mask=ym, other=0.0)
            tg = tl.load(st_gu + bg[:, None] + n[None, :], mask=(r < rg)[:, None] & nok[None, :],
                         other=0.0)  # fmt: skip
            tu = tl.load(st_gu + bu[:, None] + n[None, :], mask=(r < ru)[:, None] & nok[None, :],
                         other=0.0)  # fmt: skip
            tdt = tl.load(st_d + ad[None, :] + n[:, None], mask=nok[:, None] & (r < rd)[None, :],
                          other=0.0)  # fmt: skip  [BLOCK_N, BLOCK_R]: A_downᵀ of these columns
            if UPCAST:
                tg = tg.to(tl.float32)
                tu = tu.to(tl.float32)
                tdt = tdt.to(tl.float32)
            # g + Δg and u + Δu rounded to the dtype (what today's expand stores), then
            # SiLU·mul in fp32, rounded once (today's activation)
            g = (yg.to(tl.float32) + sg * tl.dot(zg, tg)).to(yg.dtype).to(tl.float32)
            u = (yu.to(tl.float32) + su * tl.dot(zu, tu)).to(yu.dtype).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g)) * u).to(act_ptr.dtype.element_ty)
            tl.store(act_ptr + rows[:, None] * INTER + n[None, :], act, mask=ym)
            if UPCAST:
                zd += tl.dot(act.to(tl.float32), tdt)
            else:
                zd += tl.dot(act, tdt)
        zrow = zd_ptr + sp * (T * BLOCK_R) + rows[:, None] * BLOCK_R + r[None, :]
        tl.store(zrow, zd, mask=mmask[:, None] & (r < BLOCK_R)[None, :])


@triton.jit
def _down_expand_kernel(
    y_ptr, zd_ptr, st_d, b_d, ranks_d, scales_d, sorted_ptr, counts_ptr, starts_ptr, S, R_D, T,
    OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_MAX: tl.constexpr, TARGET: tl.constexpr, SHARES: tl.constexpr, S_PAD: tl.constexpr,
    UPCAST: tl.constexpr, NPART: tl.constexpr,
):  # fmt: skip
    """``NPART`` > 0: that many partials per row (launch 1 of the row fold), else the
    fold's split count."""
    tiles, cum, n_tiles, eff = _eff(counts_ptr, S, BLOCK_M, S_PAD, SPLIT_MAX, TARGET)
    if NPART > 0:
        eff = n_tiles * 0 + NPART
    r = tl.arange(0, BLOCK_R)
    for p in range(tl.program_id(0), n_tiles * SHARES, tl.num_programs(0)):
        pid = p // SHARES
        sh = p - pid * SHARES
        slot, tile = _locate(pid, tiles, cum, S_PAD)
        bd = tl.load(b_d + slot * R_D + r, mask=r < R_D, other=0)
        rd = tl.load(ranks_d + slot)
        sd = tl.load(scales_d + slot)
        count = tl.load(counts_ptr + slot)
        start = tl.load(starts_ptr + slot)
        m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < count
        rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
        z = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
        for s in range(0, eff):  # the launch before's partials, in split order
            z += tl.load(zd_ptr + s * (T * BLOCK_R) + rows[:, None] * BLOCK_R + r[None, :],
                         mask=mmask[:, None], other=0.0)  # fmt: skip
        if not UPCAST:
            z = z.to(st_d.dtype.element_ty)
        n_t = tl.cdiv(OUT, BLOCK_N)
        per = tl.cdiv(n_t, SHARES)
        for j in range(sh * per, tl.minimum(sh * per + per, n_t)):
            n = j * BLOCK_N + tl.arange(0, BLOCK_N)
            nok = n < OUT
            ym = mmask[:, None] & nok[None, :]
            yv = tl.load(y_ptr + rows[:, None] * OUT + n[None, :], mask=ym, other=0.0)
            bt = tl.load(st_d + bd[:, None] + n[None, :], mask=(r < rd)[:, None] & nok[None, :],
                         other=0.0)  # fmt: skip
            if UPCAST:
                bt = bt.to(tl.float32)
            d = tl.dot(z, bt)
            tl.store(y_ptr + rows[:, None] * OUT + n[None, :],
                     (yv.to(tl.float32) + sd * d).to(yv.dtype), mask=ym)  # fmt: skip


@triton.jit
def _silu_shrink_kernel(
    y_ptr, act_ptr, zd_ptr, slot_ptr, st_d, a_d, ranks_d, R_D, T,
    INTER: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Row ``t``, column block ``b``: ``act = silu(g) * u`` (stored) and the down shrink's
    partial ``zd[b, t] = act[t, block] @ A_down[slot(t), :, block]ᵀ`` (fp32, of the
    rounded ``act``: what the down launch's shrink reads today)."""
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    m = cols < INTER
    g = tl.load(y_ptr + row * (2 * INTER) + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(y_ptr + row * (2 * INTER) + INTER + cols, mask=m, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g)) * u).to(act_ptr.dtype.element_ty)
    tl.store(act_ptr + row * INTER + cols, act, mask=m)
    slot = tl.load(slot_ptr + row)
    r = tl.arange(0, BLOCK_R)
    safe = tl.maximum(slot, 0)
    rank = tl.where(slot >= 0, tl.load(ranks_d + safe), 0)
    homes = tl.load(a_d + safe * R_D + r, mask=r < R_D, other=0)
    at = tl.load(st_d + homes[:, None] + cols[None, :], mask=(r < rank)[:, None] & m[None, :],
                 other=0.0)  # fmt: skip  [BLOCK_R, BLOCK]
    z = tl.sum(at.to(tl.float32) * act.to(tl.float32)[None, :], axis=1)
    tl.store(zd_ptr + blk * (T * BLOCK_R) + row * BLOCK_R + r, z)


@dataclass(frozen=True)
class RowTile:
    block: int  # SiLU·mul + row shrink column block
    num_warps: int
    down_n: int
    down_shares: int


ROW_TILES = (RowTile(512, 4, 256, 4), RowTile(1024, 4, 256, 4), RowTile(1024, 8, 256, 8),
             RowTile(2048, 8, 256, 4), RowTile(256, 4, 256, 4))


@dataclass(frozen=True)
class Tile:
    block_k: int  # launch 1's shrink
    block_n: int  # launch 1's column tile
    per_sm: int  # launch 1's live items per SM (hence its splits)
    stages: int
    down_n: int  # launch 3's column tile
    down_shares: int  # launch 3's column shares per row tile


TILES = (Tile(128, 64, 2, 3, 256, 4), Tile(256, 64, 2, 3, 256, 4), Tile(128, 128, 2, 3, 256, 4),
         Tile(128, 64, 3, 3, 256, 8), Tile(256, 128, 3, 4, 256, 8), Tile(128, 64, 4, 3, 512, 4))


class MlpLayer:
    """One ring layer: base weights, the gate/up and down factor tables (the down one's
    input is the intermediate width), the step's metadata and the fold's buffers."""

    def __init__(self, rows: int, n: int, hidden: int, inter: int, dev: str,
                 backend: TritonLoraBackend) -> None:  # fmt: skip
        self.rows, self.inter = rows, inter
        self.gu = Layer(Scenario("decode", rows, n, (16,), (inter, inter), hidden), "scattered",
                        dev)  # fmt: skip
        self.dn = Layer(Scenario("decode", rows, n, (16,), (hidden,), inter), "scattered", dev)
        self.w_gu = torch.randn(2 * inter, hidden, device=dev, dtype=DT) * 0.02
        self.w_d = torch.randn(hidden, inter, device=dev, dtype=DT) * 0.02
        gen = torch.Generator().manual_seed(3)
        slots = Scenario("decode", rows, n, (16,)).row_slot(gen)
        self.meta = backend.build_meta(torch.tensor(slots, dtype=torch.int32, device=dev),
                                       LoraMetaBuffers(rows, n, dev))
        self.ws = LoraWorkspace(backend.workspace_numel(rows, 2, 16), dev)
        self.act = torch.empty(rows, inter, device=dev, dtype=DT)
        self.y_d = torch.empty(rows, hidden, device=dev, dtype=DT)
        self.zd = torch.zeros(64 * rows * 16, device=dev, dtype=torch.float32)  # <= 64 parts
        self.scratch = torch.zeros(2 * 2048 * 16 * 16, device=dev, dtype=torch.float32)
        self.counters = torch.zeros(8192, device=dev, dtype=torch.int32)

    def base(self) -> None:
        y = self.gu.x @ self.w_gu.t()
        torch.mm(silu_and_mul(y), self.w_d.t(), out=self.y_d)

    def today(self, backend: TritonLoraBackend) -> None:
        y = self.gu.x @ self.w_gu.t()
        backend.add_lora(y, self.gu.x, self.meta, self.gu.table.weights, self.ws)
        act = silu_and_mul(y)
        torch.mm(act, self.w_d.t(), out=self.y_d)
        backend.add_lora(self.y_d, act, self.meta, self.dn.table.weights, self.ws)

    def fold(self, tile: Tile) -> None:
        y = self.gu.x @ self.w_gu.t()
        gu, dn, meta = self.gu.table, self.dn.table, self.meta
        s = gu.num_slots
        sms = 16 if INTERPRET else torch.cuda.get_device_properties(0).multi_processor_count
        target = tile.per_sm * sms
        split_max = 1 if INTERPRET else 32
        tiles_max = -(-self.rows // 16) + min(s, self.rows)
        grid1 = max(target, tiles_max)
        _gate_up_silu_shrink_kernel[(grid1,)](
            self.gu.x, y, self.act, self.zd, gu.storage, gu.a_rows, gu.b_rows, gu.ranks,
            gu.scales, dn.storage, dn.a_rows, dn.ranks, self.scratch, self.counters,
            meta.sorted_rows, meta.slot_counts, meta.slot_starts, s, self.gu.x.shape[1],
            gu.max_rank, dn.max_rank, self.rows, INTER=self.inter, BLOCK_M=16, BLOCK_R=16,
            BLOCK_K=tile.block_k, BLOCK_N=tile.block_n, SPLIT_MAX=split_max, TARGET=target,
            S_PAD=next_pow2(s), UPCAST=INTERPRET, num_warps=4, num_stages=tile.stages,
        )  # fmt: skip
        torch.mm(self.act, self.w_d.t(), out=self.y_d)
        _down_expand_kernel[(tiles_max * tile.down_shares,)](
            self.y_d, self.zd, dn.storage, dn.b_rows, dn.ranks, dn.scales, meta.sorted_rows,
            meta.slot_counts, meta.slot_starts, s, dn.max_rank, self.rows,
            OUT=self.y_d.shape[1], BLOCK_M=16, BLOCK_R=16, BLOCK_N=tile.down_n,
            SPLIT_MAX=split_max, TARGET=target, SHARES=tile.down_shares, S_PAD=next_pow2(s),
            UPCAST=INTERPRET, NPART=0, num_warps=4,
        )  # fmt: skip

    def rowfold(self, backend: TritonLoraBackend, tile: RowTile) -> None:
        """Today's gate/up launch; SiLU·mul with the down shrink's per-row partials over
        its column block; the down GEMM; the expand summing the partials."""
        y = self.gu.x @ self.w_gu.t()
        backend.add_lora(y, self.gu.x, self.meta, self.gu.table.weights, self.ws)
        dn, meta = self.dn.table, self.meta
        blocks = triton.cdiv(self.inter, tile.block)
        _silu_shrink_kernel[(self.rows, blocks)](
            y, self.act, self.zd, meta.row_slot, dn.storage, dn.a_rows, dn.ranks, dn.max_rank,
            self.rows, INTER=self.inter, BLOCK=tile.block, BLOCK_R=16, UPCAST=INTERPRET,
            num_warps=tile.num_warps,
        )  # fmt: skip
        torch.mm(self.act, self.w_d.t(), out=self.y_d)
        s = dn.num_slots
        tiles_max = -(-self.rows // 16) + min(s, self.rows)
        _down_expand_kernel[(tiles_max * tile.down_shares,)](
            self.y_d, self.zd, dn.storage, dn.b_rows, dn.ranks, dn.scales, meta.sorted_rows,
            meta.slot_counts, meta.slot_starts, s, dn.max_rank, self.rows,
            OUT=self.y_d.shape[1], BLOCK_M=16, BLOCK_R=16, BLOCK_N=tile.down_n,
            SPLIT_MAX=1, TARGET=1, SHARES=tile.down_shares, S_PAD=next_pow2(s),
            UPCAST=INTERPRET, NPART=blocks, num_warps=4,
        )  # fmt: skip


def check(layer: MlpLayer, backend: TritonLoraBackend, tile: Tile | RowTile) -> None:
    """The fold's ``act`` and down output against today's path (same rounding points
    except the fp32 order of the down shrink's partial sums), each measured against what
    LoRA changes: the gate/up LoRA's change of ``act`` and the down LoRA's change of the
    output must both be reproduced within 5%."""
    layer.today(backend)
    want = layer.y_d.clone()
    y = layer.gu.x @ layer.w_gu.t()
    act_base = silu_and_mul(y).double()
    backend.add_lora(y, layer.gu.x, layer.meta, layer.gu.table.weights, layer.ws)
    want_act = silu_and_mul(y).double()
    layer.y_d.zero_()
    layer.act.zero_()
    if isinstance(tile, RowTile):
        layer.rowfold(backend, tile)
    else:
        layer.fold(tile)
    got_act = layer.act.double()
    act_err = float((got_act - want_act).norm() / (want_act - act_base).norm())
    down_base = want_act @ layer.w_d.double().t()
    out_err = float((layer.y_d.double() - want.double()).norm()
                    / (want.double() - down_base).norm())
    if act_err > 5e-2 or out_err > 5e-2:
        raise SystemExit(f"fold mismatch: act {act_err:.2e}, down output {out_err:.2e} "
                         "of what LoRA changes")


def probe(rows: int, n: int, backend: TritonLoraBackend, ring: int) -> dict[str, object]:
    layers = [MlpLayer(rows, n, 4096, 14336, "cuda", backend) for _ in range(ring)]
    check(layers[0], backend, TILES[0])
    out: dict[str, object] = {
        "base": graph_time_us(in_order([lay.base for lay in layers])) / ring,
        "today": graph_time_us(in_order([partial(lay.today, backend) for lay in layers])) / ring,
    }
    folds = {}
    for tile in TILES:
        check(layers[0], backend, tile)
        calls: list[Callable[[], None]] = [partial(lay.fold, tile) for lay in layers]
        folds[str(tile)] = graph_time_us(in_order(calls)) / ring
    rowfolds = {}
    for row_tile in ROW_TILES:
        check(layers[0], backend, row_tile)
        row_calls: list[Callable[[], None]] = [partial(lay.rowfold, backend, row_tile)
                                               for lay in layers]  # fmt: skip
        rowfolds[str(row_tile)] = graph_time_us(in_order(row_calls)) / ring
    best = min(folds.values())
    best_row = min(rowfolds.values())
    out.update(fold=best, folds=folds, today_lora=out["today"] - out["base"],  # type: ignore[operator]
               fold_lora=best - out["base"], rowfold=best_row, rowfolds=rowfolds,  # type: ignore[operator]
               rowfold_lora=best_row - out["base"])  # type: ignore[operator]
    return out


def main() -> None:
    args = probe_parser(__doc__).parse_args()
    backend = TritonLoraBackend(fused=True)
    if args.smoke:
        for tile in TILES[:2]:
            check(MlpLayer(24, 5, 64, 320, "cpu", backend), backend,
                  Tile(32, tile.block_n, 1, 1, 64, 2))  # fmt: skip
        for block in (64, 128):  # 5 and 3 blocks of the 320 columns
            check(MlpLayer(24, 5, 64, 320, "cpu", backend), backend, RowTile(block, 4, 64, 2))
        print("smoke: ok", flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for n in (16, 50):
        results[f"T=128 n={n}"] = r = probe(128, n, backend, ring=4)
        print(f"T=128 n={n}: base {r['base']:.1f} today {r['today']:.1f} "
              f"(LoRA {r['today_lora']:.1f}) fold {r['fold']:.1f} (LoRA {r['fold_lora']:.1f}) "
              f"rowfold {r['rowfold']:.1f} (LoRA {r['rowfold_lora']:.1f}) µs/layer; "
              f"folds {r['folds']}; rowfolds {r['rowfolds']}", flush=True)  # fmt: skip
    with open(os.path.join(args.out, "lora_mlp_fold_probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
