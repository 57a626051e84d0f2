# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""Could the decode LoRA ride inside the kernels next to each projection? A probe.

At the engine's 128-row decode step over ~50 live rank-16 slots, each fused LoRA launch
spends a fixed 6-8 µs (prologue + split-K exchange) of 12-33 µs (``lora_anatomy.py``),
128 launches per step. The alternative measured here: per-row (BGMV) work folded into
kernels the step runs anyway — the shrink of q/k/v and gate/up into the RMSNorm that
produces their input (one program per row: the normalised row is at hand, the slot's
``A`` rows stream from L2 / HBM), the expand into an elementwise pass over the projection
output (RoPE + KV write, SiLU·mul, the residual add: one program per row and column
block reads and writes ``y`` anyway). No exchange, no extra launch, but every row reads
its adapter's factor rows (rows sharing an adapter hit L2).

Per Llama-8B module (T = 128 rows, 50 slots, r = 16, factors through the row-address
table, a ring of layers so factors stream from HBM, CUDA-graph replay, µs per layer):

- ``fused``: today's ``lora_fused`` launch (its own config);
- ``norm`` / ``norm+shrink``: the RMSNorm kernel alone / with the row shrink folded in
  (q/k/v and gate/up, whose input is a norm's output);
- ``empty`` / ``shrink``: a launch of T programs doing nothing / only the row shrink
  (o, down: their input comes from attention / SiLU·mul, where the shrink would fold);
- ``pass`` / ``pass+expand``: an elementwise read-modify-write of ``y`` alone / with
  the row expand folded in.

fold cost = (norm+shrink − norm, or shrink − empty) + (pass+expand − pass), against
``fused``. Every variant is checked against torch first (``--smoke`` on CPU does only
that, under ``TRITON_INTERPRET=1``).

    python3 bench/lora_fold_probe.py --out $OUT
    TRITON_INTERPRET=1 python3 bench/lora_fold_probe.py --smoke
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_anatomy import in_order, module_config, pinned_config, ring_launches
from bench.lora_cases import DECODE_MODULES, Layer, Scenario, ring_size
from bench.lora_timing import graph_time_us, module_table, probe_parser
from dataplane.intmath import next_pow2
from dataplane.kernels.triton.backend import TritonLoraBackend

EPS = 1e-5


@triton.jit
def _norm_shrink_kernel(x_ptr, w_ptr, out_ptr, z_ptr, slot_ptr, storage_ptr, a_rows_ptr,
                        ranks_ptr, S, K, R_MAX, eps, NS: tl.constexpr, R_BLK: tl.constexpr,
                        RR: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                        SHRINK: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """Row ``t``: with ``BLOCK`` > 0 ``out[t] = rmsnorm(x[t]) * w``; with ``SHRINK``
    ``z[t, k * R_BLK + i] = <src[t], A_k,slot[i]>`` for every slice ``k`` (``src`` = the
    normalised row, or ``x`` without the norm)."""
    row = tl.program_id(0).to(tl.int64)
    src = x_ptr
    if BLOCK > 0:
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        h = tl.load(x_ptr + row * K + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / K + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        tl.store(out_ptr + row * K + cols, ((h * rstd).to(dtype).to(tl.float32) * w).to(dtype),
                 mask=mask)
        tl.debug_barrier()  # the row is in memory (L1) before the shrink reads it back
        src = out_ptr
    if SHRINK:
        slot = tl.load(slot_ptr + row)
        if slot >= 0:
            j = tl.arange(0, RR)
            sl = j // R_BLK
            i = j - sl * R_BLK
            live = sl < NS
            idx = sl * S + slot
            home = tl.load(a_rows_ptr + idx * R_MAX + i, mask=live & (i < R_MAX), other=0)
            rank = tl.load(ranks_ptr + idx, mask=live, other=0)
            ok = i < rank
            acc = tl.zeros([RR], dtype=tl.float32)
            for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
                kk = k0 + tl.arange(0, BLOCK_K)
                kok = kk < K
                xv = tl.load(src + row * K + kk, mask=kok, other=0.0).to(tl.float32)
                a = tl.load(storage_ptr + home[:, None] + kk[None, :],
                            mask=ok[:, None] & kok[None, :], other=0.0)  # fmt: skip
                acc += tl.sum(a.to(tl.float32) * xv[None, :], axis=1)
            tl.store(z_ptr + row * RR + j, acc)


@triton.jit
def _pass_expand_kernel(y_ptr, z_ptr, slot_ptr, storage_ptr, b_rows_ptr, ranks_ptr,
                        scales_ptr, S, R_MAX, W_TOTAL, W0: tl.constexpr, W1: tl.constexpr,
                        R_BLK: tl.constexpr, RR: tl.constexpr, BLOCK_N: tl.constexpr,
                        EXPAND: tl.constexpr):  # fmt: skip
    """Row ``t``, column block ``c`` of ``y`` (slices' widths are multiples of
    ``BLOCK_N``): ``y[t, n] += scale * sum_i z[t, k * R_BLK + i] * Bt_k,slot[i, n - col0_k]``
    with ``EXPAND``, else ``y`` read and written back unchanged."""
    row = tl.program_id(0).to(tl.int64)
    n0 = tl.program_id(1) * BLOCK_N
    n = n0 + tl.arange(0, BLOCK_N)
    nok = n < W_TOTAL
    yv = tl.load(y_ptr + row * W_TOTAL + n, mask=nok, other=0.0)
    out = yv.to(tl.float32)
    if EXPAND:
        slot = tl.load(slot_ptr + row)
        if slot >= 0:
            sl = (n0 >= W0).to(tl.int32) + (n0 >= W0 + W1).to(tl.int32)
            col0 = tl.where(sl == 0, 0, tl.where(sl == 1, W0, W0 + W1))
            idx = sl * S + slot
            i = tl.arange(0, R_BLK)
            rank = tl.load(ranks_ptr + idx)
            scale = tl.load(scales_ptr + idx)
            ok = i < rank
            home = tl.load(b_rows_ptr + idx * R_MAX + i, mask=ok, other=0)
            zr = tl.load(z_ptr + row * RR + sl * R_BLK + i, mask=ok, other=0.0)
            bt = tl.load(storage_ptr + home[:, None] + (n - col0)[None, :],
                         mask=ok[:, None] & nok[None, :], other=0.0)  # fmt: skip
            out += tl.sum(zr[:, None] * bt.to(tl.float32), axis=0) * scale
    tl.store(y_ptr + row * W_TOTAL + n, out.to(yv.dtype), mask=nok)


@dataclass(frozen=True)
class ShrinkTile:
    block_k: int
    num_warps: int
    stages: int


@dataclass(frozen=True)
class ExpandTile:
    block_n: int
    num_warps: int


SHRINK_TILES = (ShrinkTile(128, 4, 1), ShrinkTile(128, 8, 3), ShrinkTile(256, 8, 3),
                ShrinkTile(64, 4, 4))
EXPAND_TILES = (ExpandTile(256, 4), ExpandTile(512, 4), ExpandTile(1024, 8))


class FoldLayer:
    """One ring layer's extra buffers: the norm weight and output, ``z``, the row slots."""

    def __init__(self, sc: Scenario, layer: Layer, slots: torch.Tensor) -> None:
        dev = layer.x.device
        self.sc, self.layer, self.slots = sc, layer, slots
        self.r_blk = max(16, next_pow2(sc.max_rank))
        self.rr = next_pow2(len(sc.outs)) * self.r_blk
        self.w = torch.rand(sc.d_in, device=dev, dtype=layer.x.dtype) + 0.5
        self.out = torch.empty_like(layer.x)
        self.z = torch.zeros(sc.rows, self.rr, device=dev, dtype=torch.float32)

    def shrink(self, tile: ShrinkTile, norm: bool, shrink: bool) -> Callable[[], None]:
        t = self.layer.table
        block = next_pow2(self.sc.d_in) if norm else 0
        return lambda: _norm_shrink_kernel[(self.sc.rows,)](
            self.layer.x, self.w, self.out, self.z, self.slots, t.storage, t.a_rows, t.ranks,
            t.num_slots, self.sc.d_in, t.max_rank, EPS, NS=len(self.sc.outs), R_BLK=self.r_blk,
            RR=self.rr, BLOCK=block, BLOCK_K=tile.block_k, SHRINK=shrink, STAGES=tile.stages,
            num_warps=tile.num_warps,
        )  # fmt: skip

    def expand(self, tile: ExpandTile, expand: bool) -> Callable[[], None]:
        t, outs = self.layer.table, self.sc.outs
        total = sum(outs)
        grid = (self.sc.rows, triton.cdiv(total, tile.block_n))
        return lambda: _pass_expand_kernel[grid](
            self.layer.y, self.z, self.slots, t.storage, t.b_rows, t.ranks, t.scales,
            t.num_slots, t.max_rank, total, W0=outs[0], W1=outs[1] if len(outs) > 1 else 0,
            R_BLK=self.r_blk, RR=self.rr, BLOCK_N=tile.block_n, EXPAND=expand,
            num_warps=tile.num_warps,
        )  # fmt: skip


def reference_norm(fl: FoldLayer) -> torch.Tensor:
    """HF LlamaRMSNorm in float64 statistics, rounded to the activation dtype."""
    h = fl.layer.x.double()
    normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(fl.out.dtype)
    return (normed.double() * fl.w.double()).to(fl.out.dtype)


def reference_lora(fl: FoldLayer, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 torch: ``z`` of the rows of ``src`` and ``y`` + the expand of that ``z``."""
    sc, t = fl.sc, fl.layer.table
    storage = t.storage.double()
    dev = storage.device
    z = torch.zeros(sc.rows, fl.rr, dtype=torch.float64, device=dev)
    y = fl.layer.y.double().clone()
    col0 = 0
    for k, width in enumerate(sc.outs):
        for row, slot in enumerate(fl.slots.tolist()):
            r = int(t.ranks[k, slot])
            a = storage[t.a_rows[k, slot, :r, None] + torch.arange(sc.d_in, device=dev)]
            bt = storage[t.b_rows[k, slot, :r, None] + torch.arange(width, device=dev)]
            zk = a @ src[row].double()
            z[row, k * fl.r_blk: k * fl.r_blk + r] = zk
            y[row, col0: col0 + width] += float(t.scales[k, slot]) * (zk @ bt)
        col0 += width
    return z, y


def check(fl: FoldLayer, shrink: ShrinkTile, expand: ExpandTile) -> None:
    """The folded kernels compute what they claim: the norm within two bf16 ulps (the
    interpreter truncates to bf16), ``z`` of the kernel's own normalised rows and of the
    plain rows (fp32 sums of bf16 factors), ``y`` + the expand; without the fold ``y``
    comes back unchanged."""
    y0 = fl.layer.y.clone()
    fl.shrink(shrink, True, True)()
    torch.testing.assert_close(fl.out, reference_norm(fl), rtol=2e-2, atol=2e-2)
    z, y = reference_lora(fl, fl.out)
    torch.testing.assert_close(fl.z.double(), z, rtol=1e-4, atol=1e-4)
    fl.expand(expand, True)()
    torch.testing.assert_close(fl.layer.y.double(), y, rtol=2e-2, atol=2e-2)
    if torch.equal(fl.layer.y, y0):
        raise SystemExit("the expand changed nothing")
    fl.shrink(shrink, False, True)()
    torch.testing.assert_close(fl.z.double(), reference_lora(fl, fl.layer.x)[0], rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    fl.layer.y.copy_(y0)
    fl.expand(expand, False)()
    if not torch.equal(fl.layer.y, y0):
        raise SystemExit("the pass without expand changed y")


def fold_ring(sc: Scenario, n: int, dev: str) -> list[FoldLayer]:
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device=dev)
    return [FoldLayer(sc, Layer(sc, "scattered", dev), slots) for _ in range(n)]


def partial_shrink(tile: ShrinkTile, norm: bool) -> Callable[[FoldLayer], Callable[[], None]]:
    return lambda fl: fl.shrink(tile, norm, True)


def partial_expand(tile: ExpandTile) -> Callable[[FoldLayer], Callable[[], None]]:
    return lambda fl: fl.expand(tile, True)


def probe(name: str, sc: Scenario, backend: TritonLoraBackend) -> dict[str, float]:
    n = ring_size(sc)
    with pinned_config(module_config(sc)):
        out = {"fused": graph_time_us(in_order(ring_launches(sc, n, backend)[0])) / n}
    ring = fold_ring(sc, n, "cuda")
    check(ring[0], SHRINK_TILES[0], EXPAND_TILES[0])
    normed = sc.d_in <= 8192  # q/k/v, gate/up: input from a norm

    def timed(make: Callable[[FoldLayer], Callable[[], None]]) -> float:
        return graph_time_us(in_order([make(fl) for fl in ring])) / n

    base = timed(lambda fl: fl.shrink(SHRINK_TILES[0], normed, False))
    out["norm" if normed else "empty"] = base
    shrinks = {str(tile): timed(partial_shrink(tile, normed)) for tile in SHRINK_TILES}
    best_shrink = min((t, name) for name, t in shrinks.items())
    out["norm+shrink" if normed else "shrink"] = best_shrink[0]
    out["pass"] = timed(lambda fl: fl.expand(EXPAND_TILES[0], False))
    expands = {str(tile): timed(partial_expand(tile)) for tile in EXPAND_TILES}
    best_expand = min((t, name) for name, t in expands.items())
    out["pass+expand"] = best_expand[0]
    out["fold cost"] = best_shrink[0] - base + best_expand[0] - out["pass"]
    print(f"# {name}: shrinks {shrinks}, expands {expands}", flush=True)
    torch.cuda.empty_cache()
    return out


SMOKE = {
    # slice widths in whole 1,024-column blocks (the largest expand tile)
    "q/k/v": Scenario("decode", 16, 5, (16, 8), (2048, 1024, 1024), 64),
    "down": Scenario("decode", 16, 5, (16,), (1024,), 192),
}


def main() -> None:
    args = probe_parser(__doc__).parse_args()
    if args.smoke:
        for name, sc in SMOKE.items():
            for shrink, expand in zip(SHRINK_TILES, EXPAND_TILES * 2, strict=False):
                check(fold_ring(sc, 1, "cpu")[0], shrink, expand)
            print(f"{name}: ok", flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    backend = TritonLoraBackend(fused=True)
    cols = ("fused", "norm", "norm+shrink", "empty", "shrink", "pass", "pass+expand",
            "fold cost")
    module_table(cols, DECODE_MODULES, lambda name, sc: probe(name, sc, backend),
                 os.path.join(args.out, "lora_fold_probe.json"))


if __name__ == "__main__":
    main()
