"""Gate/up LoRA + SiLU·mul at prefill sizes: the expand folded into the activation vs
``add_lora`` (shrink + expand into ``gate_up``) then ``silu_and_mul``, and the
activation alone (no LoRA) as the baseline. Llama-3-8B gate/up (4096 -> 2 x 14336),
rank 16, prefill rows in ``n`` contiguous runs of one adapter each, bf16, over a ring
of layers (own x, gate_up, factors) captured in a CUDA graph; µs per layer.

    python3 bench/lora_silu.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_cases import Layer, Scenario
from bench.lora_timing import graph_time_us
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.ops import silu_and_mul

CASES = [
    Scenario("prefill", 4096, 32, (16,), (14336, 14336)),
    Scenario("prefill", 4096, 4, (16,), (14336, 14336)),
    Scenario("prefill", 1024, 8, (16,), (14336, 14336)),
    Scenario("prefill", 512, 4, (64,), (14336, 14336)),
]
RING = 4


def time_case(sc: Scenario, backend: TritonLoraBackend) -> dict[str, float]:
    ring = [Layer(sc, "scattered") for _ in range(RING)]
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device="cuda")
    meta = backend.build_meta(slots, LoraMetaBuffers(sc.rows, sc.n, "cuda"))
    ws = LoraWorkspace(backend.workspace_numel(sc.rows, 2, sc.max_rank), "cuda")

    def act_only() -> None:
        for layer in ring:
            silu_and_mul(layer.y)

    def unfused() -> None:
        for layer in ring:
            backend.add_lora(layer.y, layer.x, meta, layer.table.weights, ws)
            silu_and_mul(layer.y)

    def folded() -> None:
        for layer in ring:
            backend.add_lora_silu_mul(layer.y, layer.x, meta, layer.table.weights, ws)

    return {
        k: graph_time_us(f) / RING
        for k, f in (("silu only", act_only), ("add_lora + silu", unfused), ("folded", folded))
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    backend = TritonLoraBackend(fused=True)
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    print(
        "| r | case | SiLU·mul alone | add_lora + SiLU·mul | **folded** "
        "| LoRA cost: unfused / folded |"
    )
    print("|---|---|---|---|---|---|")
    results = {}
    for sc in CASES:
        t = time_case(sc, backend)
        results[f"r{sc.max_rank} {sc.name}"] = t
        base = t["silu only"]
        print(
            f"| {sc.max_rank} | {sc.name} gate/up | {base:.1f} | {t['add_lora + silu']:.1f} | "
            f"**{t['folded']:.1f}** | {t['add_lora + silu'] - base:.1f} / "
            f"{t['folded'] - base:.1f} |",
            flush=True,
        )
    with open(os.path.join(args.out, "lora_silu.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
