# mypy: disable-error-code="no-untyped-def"
"""Probe: can the folded LoRA's factor reads hide behind the all-reduces (TP=2 decode)?

A TP=2 decode step spends ~11 µs in each of its two all-reduces per layer, latency-bound
on NVLink, while HBM sits idle. The folded LoRA's cost at 64 live adapters is mostly
reading their factors once per step (≈ 110 MB per rank per layer). This probe times one
TP=2 rank's layer (`bench/lora_fold.py`'s ring, CUDA graph) with each all-reduce emulated
by a spin of `--ar-us` on the compute stream, and a side stream that, during that spin,
reads what the kernels right after it will read (so it is in L2 when they do):

- ``base+ar`` / ``fold+ar``: no LoRA / the fold, with the emulated all-reduces;
- ``fold+ar+pf_b``: also prefetch the consumer's ``B`` (add-norm after o and down);
- ``fold+ar+pf_ba``: also the next GEMM's fold ``A`` rows (gate/up after o, the next
  layer's q/k/v after down).

    python3 bench/lora_fold_prefetch.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench.lora_fold as lf
from bench.lora_timing import graph_time_us
from dataplane.ops import fused_add_rms_norm, rope_and_cache, silu_and_mul

TOUCH_BLOCK = 8192


@triton.jit
def _touch(ptr, n, sink_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_last")
    s = tl.sum(x.to(tl.float32))
    if s == 1.2345e38:  # never true: keeps the load
        tl.store(sink_ptr, s)


def touch(t: torch.Tensor, sink: torch.Tensor) -> None:
    n = t.numel()
    _touch[(triton.cdiv(n, TOUCH_BLOCK),)](t, n, sink, BLOCK=TOUCH_BLOCK, num_warps=8)


def step(ring: list[lf.Layer], way: str, cos: torch.Tensor, sin: torch.Tensor,
         slots: torch.Tensor, h0: torch.Tensor, res: torch.Tensor, side: torch.cuda.Stream,
         ar_cycles: int, sink: torch.Tensor) -> Callable[[], None]:
    fold = way.startswith("fold")
    pf_b, pf_a = way.endswith(("pf_b", "pf_ba")), way.endswith("pf_ba")

    def kw(mod: lf.Module | None) -> dict[str, object]:
        return dict(fold=mod.fold, tail=mod.tail()) if fold and mod is not None else {}

    def gemm(mod: lf.Module, x: torch.Tensor) -> torch.Tensor:
        if fold:
            torch.mm(x, mod.w_aug.t(), out=mod.y_aug)
            return mod.y_aug[:, :mod.d_out]
        torch.mm(x, mod.w.t(), out=mod.y)
        return mod.y

    def all_reduce(reads: list[torch.Tensor]) -> None:
        if reads:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for t in reads:
                    touch(t, sink)
        torch.cuda._sleep(ar_cycles)

    def prefetch(b_of: lf.Module, a_of: lf.Module) -> list[torch.Tensor]:
        reads = list(b_of.fold.b) if pf_b else []
        if pf_a:
            reads.append(a_of.w_aug[a_of.d_out:])
        return reads

    def run() -> None:
        forked = False
        h, prev = h0, None
        for i, layer in enumerate(ring):
            m, nxt = layer.m, ring[(i + 1) % len(ring)].m
            x, r = fused_add_rms_norm(h, res, layer.norm_in, 1e-5, **kw(prev))  # type: ignore[arg-type]
            q, k, v = lf.split_qkv(gemm(m["qkv"], x))
            rope_and_cache(q, k, v, cos, sin, layer.k_cache, layer.v_cache, slots,
                           **kw(m["qkv"]))  # type: ignore[arg-type]
            y = gemm(m["o"], layer.attn_out)
            reads = prefetch(m["o"], m["gate_up"]) if fold else []
            forked |= bool(reads)
            all_reduce(reads)
            x, r = fused_add_rms_norm(y, r, layer.norm_post, 1e-5, **kw(m["o"]))  # type: ignore[arg-type]
            act = silu_and_mul(gemm(m["gate_up"], x), **kw(m["gate_up"]))  # type: ignore[arg-type]
            h, prev = gemm(m["down"], act), m["down"]
            reads = prefetch(m["down"], nxt["qkv"]) if fold else []
            forked |= bool(reads)
            all_reduce(reads)
        if forked:  # join the side stream back (graph capture requires it)
            torch.cuda.current_stream().wait_stream(side)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--slots", default="16,64")
    ap.add_argument("--ring", type=int, default=4)
    ap.add_argument("--ar-us", type=float, default=11.0, help="emulated all-reduce (µs)")
    args = ap.parse_args()
    lf.set_shape(2, 64)
    os.makedirs(args.out, exist_ok=True)
    rate = torch.cuda.get_device_properties(0).clock_rate  # kHz
    ar_cycles = int(args.ar_us * rate / 1000)
    side = torch.cuda.Stream()
    sink = torch.zeros(1, device="cuda")
    print(f"device {torch.cuda.get_device_name()} ar {args.ar_us} us = {ar_cycles} cycles",
          flush=True)
    results = {}
    for n in (int(s) for s in args.slots.split(",")):
        row_slot = torch.tensor([t % n for t in range(lf.ROWS)], dtype=torch.int32,
                                device="cuda")
        ring = [lf.Layer(n, row_slot) for _ in range(args.ring)]
        angles = torch.rand(lf.ROWS, lf.HEAD // 2, device="cuda") * 6.28
        cos, sin = angles.cos().to(lf.DT), angles.sin().to(lf.DT)
        kv_slots = torch.arange(lf.ROWS, device="cuda")
        h0 = torch.randn(lf.ROWS, lf.HIDDEN, device="cuda", dtype=lf.DT)
        res = torch.randn(lf.ROWS, lf.HIDDEN, device="cuda", dtype=lf.DT)
        row: dict[str, float] = {}
        for way in ("base+ar", "fold+ar", "fold+ar+pf_b", "fold+ar+pf_ba", "base+ar",
                    "fold+ar", "fold+ar+pf_b", "fold+ar+pf_ba"):
            t = graph_time_us(step(ring, way, cos, sin, kv_slots, h0, res, side, ar_cycles,
                                   sink)) / len(ring)
            row[way] = min(row.get(way, t), t)
        for way in ("fold+ar", "fold+ar+pf_b", "fold+ar+pf_ba"):
            row[f"keep {way}"] = row["base+ar"] / row[way]
        results[f"n={n}"] = row
        print(f"n={n}: " + ", ".join(f"{k} {v:.3f}" if k.startswith("keep") else f"{k} {v:.1f}"
                                    for k, v in row.items()), flush=True)
        del ring
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "lora_fold_prefetch.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
