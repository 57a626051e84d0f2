"""The LoRA branch folded into the base GEMM and its consumers, against the fused launch.

One TP=2 rank's Llama-3-8B decoder layer (``--tp 1``: one GPU's whole layer) at decode
(64 rows, rank 16, ``n`` hot slots, row t on slot t mod n; the all-reduces left out, they
are the same in every way), over a ring of layers whose weights stream from HBM, captured
in a CUDA graph (µs per layer):

- ``base``: add-RMSNorm, q/k/v GEMM, RoPE + KV write, o GEMM, add-RMSNorm, gate/up GEMM,
  SiLU·mul, down GEMM (attention left out: its output is a fixed buffer);
- ``fused``: ``base`` + the engine's fused LoRA launch after each GEMM (today's path);
- ``aug``: the GEMMs over ``[W; A_0..A_{n-1}]`` (the shrink inside cuBLAS), consumers
  unfolded: what the fold costs in the GEMMs alone;
- ``fold``: ``aug`` with the expand folded into RoPE, add-RMSNorm and SiLU·mul
  (dataplane/ops/lora_fold.py): no LoRA launch at all; ``aug+rope`` / ``aug+norm`` /
  ``aug+silu``: one consumer folded (the fold's cost per consumer); ``--sweep``: the fold
  under other kernel settings; ``--gemms``: each module's GEMM alone, base vs augmented.

    python3 bench/lora_fold.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_timing import graph_time_us
from dataplane.kernels import LoraFactorTable, LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.ops import fused_add_rms_norm, rope_and_cache, silu_and_mul
from dataplane.ops.lora_fold import FoldedExpand
from dataplane.ops.triton import rms_norm, rotary_kv, silu_mul

DT = torch.bfloat16
ROWS, RANK, HEAD = 64, 16, 128
HIDDEN, HQ, HKV, INTER = 4096, 16, 4, 7168  # one TP=2 rank of Llama-3-8B (`--tp 1`: all)
MODULES: dict[str, tuple[int, tuple[int, ...]]] = {}  # name -> (d_in, slice widths)


def set_shape(tp: int, rows: int = 64) -> None:
    """One TP rank's Llama-3-8B layer (tp = 1: the whole layer, one GPU's shapes) at
    `rows` decode rows."""
    global HQ, HKV, INTER, ROWS
    HQ, HKV, INTER, ROWS = 32 // tp, 8 // tp, 14336 // tp, rows
    MODULES.clear()
    MODULES.update({
        "qkv": (HIDDEN, (HQ * HEAD, HKV * HEAD, HKV * HEAD)), "o": (HQ * HEAD, (HIDDEN,)),
        "gate_up": (HIDDEN, (INTER, INTER)), "down": (INTER, (HIDDEN,))})


set_shape(2)


class Module:
    """One projection: base weight, augmented weight, the fused path's table, the fold."""

    def __init__(self, d_in: int, widths: tuple[int, ...], n: int, row_slot: torch.Tensor
                 ) -> None:
        d_out, c = sum(widths), len(widths) * RANK
        self.w = torch.randn(d_out, d_in, device="cuda", dtype=DT) * 0.02
        self.w_aug = torch.cat((self.w, torch.randn(n * c, d_in, device="cuda", dtype=DT)
                                * 0.02))
        self.table = LoraFactorTable(n, d_in, widths, RANK, DT, "cuda")
        self.table.storage.normal_(0.0, 0.02)
        self.table.ranks.fill_(RANK)
        self.table.scales.fill_(2.0)
        self.fold = FoldedExpand(row_slot, tuple(
            torch.randn(n, RANK, w, device="cuda", dtype=DT) * 0.02 for w in widths),
            torch.full((n, len(widths)), 2.0, device="cuda"))
        self.y = torch.empty(ROWS, d_out, device="cuda", dtype=DT)
        self.y_aug = torch.empty(ROWS, d_out + n * c, device="cuda", dtype=DT)
        self.d_out = d_out

    def tail(self) -> torch.Tensor:
        return self.y_aug[:, self.d_out:]


class Layer:
    def __init__(self, n: int, row_slot: torch.Tensor) -> None:
        self.m = {name: Module(d_in, widths, n, row_slot)
                  for name, (d_in, widths) in MODULES.items()}
        self.norm_in = torch.rand(HIDDEN, device="cuda", dtype=DT) + 0.5
        self.norm_post = torch.rand(HIDDEN, device="cuda", dtype=DT) + 0.5
        self.k_cache = torch.zeros(1024, HKV, HEAD, device="cuda", dtype=DT)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.attn_out = torch.randn(ROWS, HQ * HEAD, device="cuda", dtype=DT)


def split_qkv(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q_w, kv_w = HQ * HEAD, HKV * HEAD
    return (qkv[:, :q_w].view(ROWS, HQ, HEAD), qkv[:, q_w:q_w + kv_w].view(ROWS, HKV, HEAD),
            qkv[:, q_w + kv_w:q_w + 2 * kv_w].view(ROWS, HKV, HEAD))


def step(ring: list[Layer], way: str, lora: Callable[[Module, torch.Tensor], None],
         cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, h0: torch.Tensor,
         res: torch.Tensor) -> Callable[[], None]:
    aug = way.startswith(("aug", "fold"))
    folded = {"fold": ("rope", "norm", "silu")}.get(way, tuple(way.split("+")[1:]))

    def kw(mod: Module | None, consumer: str) -> dict[str, object]:
        return (dict(fold=mod.fold, tail=mod.tail())
                if mod is not None and consumer in folded else {})

    def gemm(mod: Module, x: torch.Tensor) -> torch.Tensor:
        if aug:
            torch.mm(x, mod.w_aug.t(), out=mod.y_aug)
            return mod.y_aug[:, :mod.d_out]
        torch.mm(x, mod.w.t(), out=mod.y)
        lora(mod, x)
        return mod.y

    def run() -> None:
        h, prev = h0, None
        for layer in ring:
            m = layer.m
            x, r = fused_add_rms_norm(h, res, layer.norm_in, 1e-5,
                                      **kw(prev, "norm"))  # type: ignore[arg-type]
            q, k, v = split_qkv(gemm(m["qkv"], x))
            rope_and_cache(q, k, v, cos, sin, layer.k_cache, layer.v_cache, slots,
                           **kw(m["qkv"], "rope"))  # type: ignore[arg-type]
            y = gemm(m["o"], layer.attn_out)
            x, r = fused_add_rms_norm(y, r, layer.norm_post, 1e-5,
                                      **kw(m["o"], "norm"))  # type: ignore[arg-type]
            gu = gemm(m["gate_up"], x)
            act = silu_and_mul(gu, **kw(m["gate_up"], "silu"))  # type: ignore[arg-type]
            h, prev = gemm(m["down"], act), m["down"]

    return run


FOLD_MODULES = {"rope": rotary_kv, "norm": rms_norm, "silu": silu_mul}
SWEEP: list[dict[str, int]] = [
    {}, {"rope.FOLD_RC": 4}, {"rope.FOLD_RC": 8}, {"rope.FOLD_NUM_WARPS": 2, "rope.FOLD_RC": 8},
    {"norm.FOLD_RC": 2}, {"norm.FOLD_RC": 8}, {"norm.FOLD_NUM_WARPS": 8},
    {"norm.FOLD_NUM_WARPS": 32}, {"silu.FOLD_RC": 2}, {"silu.FOLD_RC": 8},
    {"silu.FOLD_RC": 16}, {"silu.FOLD_BLOCK": 2048, "silu.FOLD_NUM_WARPS": 8,
                           "silu.FOLD_RC": 2},
    # many distinct adapters per step (64 rows on 64 slots)
    {"silu.FOLD_BLOCK": 512}, {"silu.FOLD_BLOCK": 512, "silu.FOLD_NUM_WARPS": 2},
    {"silu.FOLD_BLOCK": 2048, "silu.FOLD_NUM_WARPS": 8},
    {"norm.FOLD_RC": 16}, {"norm.FOLD_NUM_WARPS": 8, "norm.FOLD_RC": 16},
    {"rope.FOLD_NUM_WARPS": 2}, {"rope.FOLD_NUM_WARPS": 4}]


def fold_variant(settings: dict[str, int]) -> dict[str, int]:
    """Set the fold kernels' launch settings (``"rope.FOLD_RC": 8``...; plan caches
    cleared); returns the previous values."""
    old = {}
    for key, value in settings.items():
        name, attr = key.split(".")
        mod = FOLD_MODULES[name]
        old[key] = getattr(mod, attr)
        setattr(mod, attr, value)
    rotary_kv._plan.cache_clear()
    rms_norm._plan.cache_clear()
    return old


def gemm_loop(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
    def run() -> None:
        for x, w in pairs:
            torch.mm(x, w.t())

    return run


def time_gemms(ring: list[Layer], n: int) -> dict[str, float]:
    """Each module's GEMM alone over the ring (µs per GEMM): base, augmented, augmented
    with its tail padded by 128 / 256 zero rows, augmented and base under cuBLASLt, and
    the base plus a second GEMM for the tail."""
    out: dict[str, float] = {}
    for name in MODULES:
        mods = [layer.m[name] for layer in ring]
        xs = [torch.randn(ROWS, m.w.shape[1], device="cuda", dtype=DT) for m in mods]
        pads = {p: [torch.cat((m.w_aug, torch.zeros(p, m.w.shape[1], device="cuda",
                                                     dtype=DT))) for m in mods]
                for p in (128, 256)}
        ways = {"base": gemm_loop([(x, m.w) for m, x in zip(mods, xs, strict=True)]),
                "aug": gemm_loop([(x, m.w_aug) for m, x in zip(mods, xs, strict=True)]),
                "two": gemm_loop([pair for m, x in zip(mods, xs, strict=True)
                                  for pair in ((x, m.w), (x, m.w_aug[m.d_out:]))])}
        for p, ws in pads.items():
            ways[f"pad{p}"] = gemm_loop(list(zip(xs, ws, strict=True)))
        for way, fn in ways.items():
            out[f"{name} {way}"] = graph_time_us(fn) / len(ring)
        torch.backends.cuda.preferred_blas_library("cublaslt")
        out[f"{name} aug/lt"] = graph_time_us(ways["aug"]) / len(ring)
        out[f"{name} base/lt"] = graph_time_us(ways["base"]) / len(ring)
        torch.backends.cuda.preferred_blas_library("cublas")
        del pads
    print(f"GEMMs n={n}: " + ", ".join(f"{k} {v:.1f}" for k, v in out.items()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--slots", default="16,64")
    ap.add_argument("--ring", type=int, default=4)
    ap.add_argument("--rows", type=int, default=64, help="decode rows per step (<= 1024)")
    ap.add_argument("--tp", type=int, choices=(1, 2), default=2,
                    help="layer of one TP=2 rank (default) or the whole layer (one GPU)")
    ap.add_argument("--sweep", action="store_true",
                    help="also time the fold under each of SWEEP's kernel settings")
    ap.add_argument("--gemms", action="store_true",
                    help="also time each module's GEMM: base, augmented and variants")
    args = ap.parse_args()
    set_shape(args.tp, args.rows)
    os.makedirs(args.out, exist_ok=True)
    backend = TritonLoraBackend(fused=True)
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    results = {}
    for n in (int(s) for s in args.slots.split(",")):
        row_slot = torch.tensor([t % n for t in range(ROWS)], dtype=torch.int32,
                                device="cuda")
        ring = [Layer(n, row_slot) for _ in range(args.ring)]
        meta = backend.build_meta(row_slot, LoraMetaBuffers(ROWS, n, "cuda"))
        ws = LoraWorkspace(backend.workspace_numel(ROWS, 3, RANK), "cuda")
        angles = torch.rand(ROWS, HEAD // 2, device="cuda") * 6.28
        cos, sin = angles.cos().to(DT), angles.sin().to(DT)
        kv_slots = torch.arange(ROWS, device="cuda")
        h0 = torch.randn(ROWS, HIDDEN, device="cuda", dtype=DT)
        res = torch.randn(ROWS, HIDDEN, device="cuda", dtype=DT)

        def fused(mod: Module, x: torch.Tensor, meta: object = meta,
                  ws: LoraWorkspace = ws) -> None:
            backend.add_lora(mod.y, x, meta, mod.table.weights, ws)  # type: ignore[arg-type]

        def none(mod: Module, x: torch.Tensor) -> None:
            return None

        row = {}
        for way, lora in (("base", none), ("fused", fused), ("aug", none), ("aug+rope", none),
                          ("aug+norm", none), ("aug+silu", none), ("fold", none)):
            row[way] = graph_time_us(step(ring, way, lora, cos, sin, kv_slots, h0, res)) \
                / len(ring)
        for settings in SWEEP if args.sweep else []:
            old = fold_variant(settings)
            label = ",".join(f"{k}={v}" for k, v in settings.items()) or "defaults"
            row[f"fold {label}"] = graph_time_us(
                step(ring, "fold", none, cos, sin, kv_slots, h0, res)) / len(ring)
            fold_variant(old)
        if args.gemms:
            row.update(time_gemms(ring, n))
        row["LoRA fused"] = row["fused"] - row["base"]
        row["LoRA fold"] = row["fold"] - row["base"]
        results[f"n={n}"] = row
        print(f"n={n}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
        del ring
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, f"lora_fold_tp{args.tp}_rows{ROWS}.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
