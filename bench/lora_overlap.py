"""Can the LoRA branch hide under the base GEMM? A CUDA-graph experiment.

For each engine module shape (Llama-3-8B: q/k/v, o, gate/up, down) at the engine's
128-row decode step with ~50 live rank-16 slots, and in a mixed step (``--mixed-rows``:
104 decode rows + 3 prefill runs, 53 slots), over a ring of layers (own base weight, x,
y, factors; weights stream from HBM), graphs timed (µs per layer):

- ``base``: ``y = x Wᵀ`` (cuBLAS) only;
- ``serial``: the base GEMM, then ``add_lora`` into ``y`` (what the engine does);
- ``overlap``: ``add_lora`` into a separate delta buffer on a side stream while the
  GEMM runs on the main stream, joined after both; ``overlap+add`` adds ``y += delta``;
- ``split-serial`` / ``split-overlap``: the two-kernel path, its shrink serial / on the
  side stream under the GEMM, the expand into ``y`` after the join (no delta buffer);
- ``…/cK``: cuBLASLt told to leave K SMs to the side stream
  (``torch._C._set_sm_carveout_experimental``); ``gemm-first`` / ``lora-first``: which
  of the two is captured first;
- ``greenK``: the side stream of a CUDA green context of K SMs (reported if the runtime
  refuses it).

    python3 bench/lora_overlap.py --out $OUT
    python3 bench/lora_overlap.py --tp2 --carveouts "" --green "" --out $OUT  # TP=2 shards
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

from bench.lora_cases import DECODE_MODULES, DT, RING_WEIGHT_BYTES, Layer, Scenario, mixed_cases
from bench.lora_timing import graph_time_us
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton.backend import TritonLoraBackend


def tp2_decode_cases(n: int) -> list[Scenario]:
    """One rank's Llama-8B modules at TP=2 (q/k/v and gate/up output-sharded, o and down
    input-sharded), the bench's 64-row decode step over ``n`` rank-16 slots."""
    return [Scenario("decode", 64, n, (16,), outs, d_in) for outs, d_in in (
        ((2048, 512, 512), 4096), ((4096,), 2048), ((7168, 7168), 4096), ((4096,), 7168))]


def ring_for(sc: Scenario) -> tuple[list[Layer], list[torch.Tensor], list[torch.Tensor]]:
    d_out = sum(sc.outs)
    n = max(3, math.ceil(RING_WEIGHT_BYTES / (d_out * sc.d_in * 2)))
    ring = [Layer(sc, "scattered") for _ in range(n)]
    weights = [torch.randn(d_out, sc.d_in, device="cuda", dtype=DT) * 0.02 for _ in ring]
    return ring, weights, [torch.zeros_like(layer.y) for layer in ring]


def blas(carveout: int | None) -> None:
    """cuBLAS (``None``) or cuBLASLt told to leave ``carveout`` SMs free (its heuristic
    picks an algorithm for the remaining SMs; the LoRA's programs get the rest)."""
    torch.backends.cuda.preferred_blas_library("cublas" if carveout is None else "cublaslt")
    torch._C._set_sm_carveout_experimental(carveout)


def time_shape(sc: Scenario, backend: TritonLoraBackend,
               carveouts: tuple[int, ...], green: tuple[int, ...]) -> dict[str, float]:
    ring, weights, deltas = ring_for(sc)
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device="cuda")
    meta = backend.build_meta(slots, LoraMetaBuffers(sc.rows, sc.slots, "cuda"))
    ws = LoraWorkspace(backend.workspace_numel(sc.rows, len(sc.outs), sc.max_rank), "cuda")
    pairs = list(zip(ring, weights, deltas, strict=True))

    def base() -> None:
        for layer, w, _ in pairs:
            torch.mm(layer.x, w.t(), out=layer.y)

    def serial() -> None:
        for layer, w, _ in pairs:
            torch.mm(layer.x, w.t(), out=layer.y)
            backend.add_lora(layer.y, layer.x, meta, layer.table.weights, ws)

    def overlap(side: torch.cuda.Stream, lora_first: bool, add: bool) -> Callable[[], None]:
        def run() -> None:
            main = torch.cuda.current_stream()
            for layer, w, d in pairs:
                side.wait_stream(main)
                if not lora_first:
                    torch.mm(layer.x, w.t(), out=layer.y)
                with torch.cuda.stream(side):
                    backend.add_lora(d, layer.x, meta, layer.table.weights, ws)
                if lora_first:
                    torch.mm(layer.x, w.t(), out=layer.y)
                main.wait_stream(side)
                if add:
                    layer.y.add_(d)

        return run

    def split(side: torch.cuda.Stream | None) -> Callable[[], None]:
        """The shrink (the split-K half) on ``side`` under the GEMM, the expand into
        ``y`` after the join: no delta buffer, nothing to add. ``None``: all serial."""
        def run() -> None:
            main = torch.cuda.current_stream()
            for layer, w, _ in pairs:
                if side is None:
                    z = backend.shrink(layer.x, meta, layer.table.weights, ws)
                    torch.mm(layer.x, w.t(), out=layer.y)
                else:
                    side.wait_stream(main)
                    torch.mm(layer.x, w.t(), out=layer.y)
                    with torch.cuda.stream(side):
                        z = backend.shrink(layer.x, meta, layer.table.weights, ws)
                    main.wait_stream(side)
                backend.expand(layer.y, z, meta, layer.table.weights)

        return run

    n = len(ring)
    side = torch.cuda.Stream()
    out: dict[str, float] = {"ring": n}
    blas(None)
    for name, fn in (("base", base), ("serial", serial),
                     ("overlap", overlap(side, True, False)),
                     ("overlap+add", overlap(side, True, True)),
                     ("split-serial", split(None)), ("split-overlap", split(side))):
        out[name] = graph_time_us(fn) / n
    for k in carveouts:
        blas(k)
        for name, fn in ((f"base/c{k}", base), (f"serial/c{k}", serial),
                         (f"gemm-first/c{k}", overlap(side, False, False)),
                         (f"lora-first/c{k}", overlap(side, True, False)),
                         (f"split-overlap/c{k}", split(side))):
            out[name] = graph_time_us(fn) / n
    blas(None)
    for k in green:
        try:
            ctx = torch.cuda.green_contexts.GreenContext.create(num_sms=k)
            gside: torch.cuda.Stream = ctx.Stream()  # type: ignore[attr-defined]
            out[f"green{k}"] = graph_time_us(overlap(gside, False, False)) / n
            out[f"green-split{k}"] = graph_time_us(split(gside)) / n
        except Exception as exc:  # a probe: report what the runtime says
            print(f"green context {k} SMs: {type(exc).__name__}: {exc}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--carveouts", default="8,16,32")
    ap.add_argument("--green", default="16")
    ap.add_argument("--mixed-rows", type=int, default=2048)
    ap.add_argument("--tp2", action="store_true",
                    help="the TP=2 decode step's shards instead (T = 64, 16 and 64 slots)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    carveouts = tuple(int(k) for k in args.carveouts.split(",") if k)
    green = tuple(int(k) for k in args.green.split(",") if k)
    backend = TritonLoraBackend(fused=True)
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    names = ("q/k/v", "o", "gate/up", "down")
    if args.tp2:
        cases = [(f"TP=2 {name} T=64 n={n}", sc) for n in (16, 64)
                 for name, sc in zip(names, tp2_decode_cases(n), strict=True)]
    else:
        cases = [(f"{name} T=128", sc) for name, sc in DECODE_MODULES.items()]
        cases += [(f"{name} T={args.mixed_rows}", sc)
                  for name, sc in zip(names, mixed_cases(args.mixed_rows), strict=True)]
    results = {}
    for label, sc in cases:
        t = time_shape(sc, backend, carveouts, green)
        results[label] = t
        cells = ", ".join(f"{k} {v:.1f}" for k, v in t.items() if k != "ring")
        print(f"{label}: {cells}", flush=True)
    with open(os.path.join(args.out, "lora_overlap.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
