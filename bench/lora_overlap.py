"""Can the decode LoRA branch hide under the base GEMM? A CUDA-graph experiment.

For each engine module shape (Llama-3-8B: q/k/v, o, gate/up, down) at the engine's
128-row decode step with ~50 live rank-16 slots, over a ring of layers (own base
weight, x, y, factors; weights stream from HBM), four graphs are timed:

- ``base``: ``y = x Wᵀ`` (cuBLAS) only;
- ``serial``: the base GEMM, then ``add_lora`` into ``y`` (what the engine does);
- ``overlap``: ``add_lora`` into a separate delta buffer on a side stream while the
  GEMM runs on the main stream, joined after both (the delta would be added by the
  next fused elementwise op: RoPE/KV write, SiLU·mul, residual + RMSNorm);
- ``overlap+add``: the same plus an explicit ``y += delta`` after the join.

Prints µs per layer and the LoRA's visible cost (graph − base) per way.

    python3 bench/lora_overlap.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_cases import DECODE_MODULES, DT, RING_WEIGHT_BYTES, Layer, Scenario
from bench.lora_timing import graph_time_us
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton.backend import TritonLoraBackend


def time_shape(sc: Scenario, backend: TritonLoraBackend) -> dict[str, float]:
    d_out = sum(sc.outs)
    n = max(3, math.ceil(RING_WEIGHT_BYTES / (d_out * sc.d_in * 2)))
    ring = [Layer(sc, "scattered") for _ in range(n)]
    weights = [torch.randn(d_out, sc.d_in, device="cuda", dtype=DT) * 0.02 for _ in ring]
    deltas = [torch.zeros_like(layer.y) for layer in ring]
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device="cuda")
    meta = backend.build_meta(slots, LoraMetaBuffers(sc.rows, sc.slots, "cuda"))
    ws = LoraWorkspace(backend.workspace_numel(sc.rows, len(sc.outs), sc.max_rank), "cuda")
    side = torch.cuda.Stream()

    def base() -> None:
        for layer, w in zip(ring, weights, strict=True):
            torch.mm(layer.x, w.t(), out=layer.y)

    def serial() -> None:
        for layer, w in zip(ring, weights, strict=True):
            torch.mm(layer.x, w.t(), out=layer.y)
            backend.add_lora(layer.y, layer.x, meta, layer.table.weights, ws)

    def overlap(add: bool) -> Callable[[], None]:
        def run() -> None:
            main = torch.cuda.current_stream()
            for layer, w, d in zip(ring, weights, deltas, strict=True):
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    backend.add_lora(d, layer.x, meta, layer.table.weights, ws)
                torch.mm(layer.x, w.t(), out=layer.y)
                main.wait_stream(side)
                if add:
                    layer.y.add_(d)

        return run

    fns = {"base": base, "serial": serial, "overlap": overlap(False), "overlap+add": overlap(True)}
    out = {k: graph_time_us(f) / n for k, f in fns.items()}
    out["ring"] = n
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    backend = TritonLoraBackend(fused=True)
    results = {}
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    print("| module | base | serial | overlap | overlap+add | LoRA visible: serial / overlap |")
    print("|---|---|---|---|---|---|")
    for name, sc in DECODE_MODULES.items():
        t = time_shape(sc, backend)
        results[name] = t
        print(
            f"| {name} | {t['base']:.1f} | {t['serial']:.1f} | {t['overlap']:.1f} | "
            f"{t['overlap+add']:.1f} | {t['serial'] - t['base']:.1f} / "
            f"{t['overlap'] - t['base']:.1f} |",
            flush=True,
        )
    with open(os.path.join(args.out, "lora_overlap.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
