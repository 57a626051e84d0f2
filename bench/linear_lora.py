"""The base projection with the LoRA expand in its epilogue (``linear_lora``) against what
the engine runs today: cuBLAS for the base, then the fused LoRA launch.

Per Llama-3-8B module (q/k/v, o, gate/up, down) at the engine's 128-row decode step over
~50 live rank-16 slots (and 64 rows over 16), over a ring of layers whose base weights
stream from HBM, CUDA-graph replay, median µs per layer:

- ``cublas``: ``torch.mm`` alone (the base without adapters, today);
- ``cublas+lora``: the base, then the fused LoRA launch (with adapters, today);
- ``triton``: ``linear_lora`` without adapters (the base through the new kernel);
- ``triton+lora``: the segmented shrink, then ``linear_lora`` with the expand gathered
  per row in its epilogue;

for each candidate tile (``CANDIDATES``), best per column. The floor is the module's
weight bytes + the live adapters' factor bytes at the measured copy bandwidth.

    python3 bench/linear_lora.py --out $OUT
    TRITON_INTERPRET=1 python3 bench/linear_lora.py --smoke   # CPU: plumbing only
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_anatomy import module_config, pinned_config, ring_launches
from bench.lora_cases import DECODE_MODULES, DT, RING_WEIGHT_BYTES, Layer, Scenario
from bench.lora_timing import device_bench_args, graph_time_us
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.kernels.triton.configs import fused_shape
from dataplane.kernels.triton.linear_lora_ops import LinearLoraConfig, LinearScratch, linear_lora

MODULES = {
    **DECODE_MODULES,
    "o, 64 rows / 16": Scenario("decode", 64, 16, (16,)),
    "gate/up, 64 rows / 16": Scenario("decode", 64, 16, (16,), (14336, 14336)),
}
CANDIDATES = [
    LinearLoraConfig(block_m=m, block_n=bn, block_k=bk, num_warps=w, num_stages=st,
                     split_k=sk, pdl=1)
    for m, bn, bk, w, st, sk in (
        # x is re-read from L2 once per column tile (T x K per block_n columns): at 128
        # rows a 64-column tile reads twice the weight's bytes of x, so wide tiles first
        (128, 128, 128, 8, 3, 4), (128, 128, 64, 8, 4, 2), (128, 128, 128, 8, 3, 2),
        (64, 128, 128, 4, 4, 4), (64, 256, 64, 8, 3, 1), (64, 256, 64, 8, 3, 2),
        (128, 64, 128, 4, 4, 4), (64, 128, 128, 4, 4, 1),
    )
]  # fmt: skip
SMOKE = {
    "q/k/v": Scenario("decode", 16, 5, (16,), (128, 32, 32), 64),
    "down": Scenario("decode", 16, 5, (16,), (64,), 192),
}
SMOKE_CANDIDATES = [LinearLoraConfig(16, 32, 32, 4, 2, 1), LinearLoraConfig(16, 32, 32, 4, 2, 2)]


class Ring:
    """Layers of one module (own x, y, factors, base weight) and the step's metadata."""

    def __init__(self, sc: Scenario, layers: list[Layer], dev: str) -> None:
        self.sc = sc
        self.layers = layers
        n = len(layers)
        self.weights = [torch.randn(sum(sc.outs), sc.d_in, device=dev, dtype=DT) * 0.02
                        for _ in range(n)]  # fmt: skip
        backend = TritonLoraBackend(fused=True)
        gen = torch.Generator().manual_seed(1)
        slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device=dev)
        self.meta = backend.build_meta(slots, LoraMetaBuffers(sc.rows, sc.slots, dev))
        self.ws = LoraWorkspace(backend.workspace_numel(sc.rows, len(sc.outs), sc.max_rank),
                                dev)  # fmt: skip
        self.dev = dev

    def ours(self, cfg: LinearLoraConfig, lora: bool) -> Callable[[], None]:
        scratch = LinearScratch.allocate(self.sc.rows, sum(self.sc.outs), cfg, self.dev)

        def run() -> None:
            for layer, w in zip(self.layers, self.weights, strict=True):
                if lora:
                    linear_lora(layer.x, w, layer.y, cfg, scratch, self.meta,
                                layer.table.weights, self.ws)  # fmt: skip
                else:
                    linear_lora(layer.x, w, layer.y, cfg, scratch)

        return run


def module_times(sc: Scenario, bandwidth: float) -> dict[str, object]:
    n = max(3, -(-RING_WEIGHT_BYTES // (sum(sc.outs) * sc.d_in * 2)))
    launches, layers = ring_launches(sc, n, TritonLoraBackend(fused=True))  # today's LoRA
    ring = Ring(sc, layers, "cuda")
    weight_bytes = sum(sc.outs) * sc.d_in * 2
    out: dict[str, object] = {"floor": (weight_bytes + sc.adapter_bytes()) / bandwidth * 1e6}

    def cublas() -> None:
        for layer, w in zip(ring.layers, ring.weights, strict=True):
            torch.mm(layer.x, w.t(), out=layer.y)

    def cublas_lora() -> None:
        for layer, w, launch in zip(ring.layers, ring.weights, launches, strict=True):
            torch.mm(layer.x, w.t(), out=layer.y)
            launch()

    out["cublas"] = graph_time_us(cublas) / n
    with pinned_config(module_config(sc)):
        out["cublas+lora"] = graph_time_us(cublas_lora) / n
    for lora in (False, True):
        name = "triton+lora" if lora else "triton"
        best, best_cfg = float("inf"), None
        for cfg in CANDIDATES:
            if any(w % cfg.block_n for w in sc.outs):
                continue
            try:
                t = graph_time_us(ring.ours(cfg, lora)) / n
            except Exception as exc:  # a tile that does not compile (shared memory)
                print(f"  {sc.name} {cfg}: {type(exc).__name__}: {exc}", flush=True)
                continue
            print(f"  {name} {cfg}: {t:.1f} µs", flush=True)
            if t < best:
                best, best_cfg = t, cfg
        out[name] = best
        out[f"{name} config"] = repr(best_cfg)
    torch.cuda.empty_cache()
    return out


def smoke() -> None:
    """CPU (interpreter): every candidate of the smoke set runs with and without LoRA and
    the LoRA changes ``y``."""
    for name, sc in SMOKE.items():
        ring = Ring(sc, [Layer(sc, "scattered", "cpu")], "cpu")
        for cfg in SMOKE_CANDIDATES:
            ring.ours(cfg, False)()
            plain = ring.layers[0].y.clone()
            ring.ours(cfg, True)()
            if torch.equal(plain, ring.layers[0].y):
                raise SystemExit(f"{name} {cfg}: the adapters changed nothing")
        print(f"{name}: ok", flush=True)


def main() -> None:
    parsed = device_bench_args(__doc__, smoke)
    if parsed is None:
        return
    out_dir, bw = parsed
    cols = ("floor", "cublas", "cublas+lora", "triton", "triton+lora")
    rows = []
    results = {}
    for name, sc in MODULES.items():
        t = module_times(sc, bw)
        results[name] = t
        rows.append(f"| {name} | " + " | ".join(f"{t[c]:.1f}" for c in cols) + " |")
        print(rows[-1], flush=True)
    print("| module (µs per layer) | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    print("\n".join(rows))
    print("# ---- LINEAR_TABLE entries (linear_lora_ops.py), triton+lora winners at 128 rows ----")
    for name, sc in DECODE_MODULES.items():
        shape = fused_shape(sc.d_in, sc.outs)
        print(f'    "{shape}": {results[name]["triton+lora config"]},  # {name}')
    with open(os.path.join(out_dir, "linear_lora.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
