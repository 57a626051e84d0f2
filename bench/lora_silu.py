"""Gate/up LoRA + SiLU·mul at prefill sizes: the expand folded into the activation vs
``add_lora`` (shrink + expand into ``gate_up``) then ``silu_and_mul``, and the
activation alone (no LoRA) as the baseline. Llama-3-8B gate/up (4096 -> 2 x 14336),
rank 16, prefill rows in ``n`` contiguous runs of one adapter each, bf16, over a ring
of layers (own x, gate_up, factors) captured in a CUDA graph; µs per layer.

    python3 bench/lora_silu.py --out $OUT           # the committed table (SILU_TABLE)
    python3 bench/lora_silu.py --sweep --out $OUT   # tune the fold's tile per T class

``--sweep`` times the fold with each of ``CANDIDATES`` per prefill T class (T = 1,024 and
4,096 cases; larger steps take the 4,096 winner), installs a class's best only where it
beats add_lora + SiLU·mul by 3%, else null (do not fold), prints the table and writes it
to ``$OUT/tuned_configs.json`` (``ADAPTERPLANE_LORA_TUNED=<file>`` installs it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_cases import Layer, Scenario
from bench.lora_timing import graph_time_us
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton import configs
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.ops import silu_and_mul

CASES = [
    Scenario("prefill", 4096, 32, (16,), (14336, 14336)),
    Scenario("prefill", 4096, 4, (16,), (14336, 14336)),
    Scenario("prefill", 1024, 8, (16,), (14336, 14336)),
    Scenario("prefill", 512, 4, (64,), (14336, 14336)),
]
RING = 4
# (block_m, block_n, block_r (set per rank), warps, stages, column tiles per program)
CANDIDATES = [
    configs.ExpandConfig(32, 128, 64, 4, 3, 8),  # the plain expand's prefill tile
    configs.ExpandConfig(32, 128, 64, 8, 3, 8),
    configs.ExpandConfig(16, 128, 64, 4, 3, 8),
    configs.ExpandConfig(16, 256, 64, 4, 2, 4),
    configs.ExpandConfig(64, 64, 64, 4, 3, 8),
    configs.ExpandConfig(64, 128, 64, 8, 3, 4),
    configs.ExpandConfig(32, 64, 64, 4, 3, 8),
    configs.ExpandConfig(32, 256, 64, 8, 2, 4),
    # the next column tile's gate, up and factor tiles loaded ahead (`y_prefetch`)
    configs.ExpandConfig(16, 128, 64, 4, 3, 8, y_prefetch=True),
    configs.ExpandConfig(16, 128, 64, 4, 1, 8, y_prefetch=True),
    configs.ExpandConfig(32, 128, 64, 4, 3, 8, y_prefetch=True),
    configs.ExpandConfig(16, 256, 64, 4, 2, 4, y_prefetch=True),
    configs.ExpandConfig(16, 64, 64, 4, 3, 16, y_prefetch=True),
    configs.ExpandConfig(32, 128, 64, 8, 3, 8, y_prefetch=True),
]


class Case:
    """One scenario's ring, metadata and workspace, and its three ways."""

    def __init__(self, sc: Scenario, backend: TritonLoraBackend) -> None:
        self.sc, self.backend = sc, backend
        self.ring = [Layer(sc, "scattered") for _ in range(RING)]
        gen = torch.Generator().manual_seed(1)
        slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device="cuda")
        self.meta = backend.build_meta(slots, LoraMetaBuffers(sc.rows, sc.slots, "cuda"))
        self.ws = LoraWorkspace(backend.workspace_numel(sc.rows, 2, sc.max_rank), "cuda")

    def act_only(self) -> float:
        def run() -> None:
            for layer in self.ring:
                silu_and_mul(layer.y)

        return graph_time_us(run) / RING

    def unfused(self) -> float:
        def run() -> None:
            for layer in self.ring:
                self.backend.add_lora(layer.y, layer.x, self.meta, layer.table.weights, self.ws)
                silu_and_mul(layer.y)

        return graph_time_us(run) / RING

    def folded(self, tile: configs.ExpandConfig) -> float:
        t_class = configs.bucket(self.sc.rows, configs.T_BUCKETS)
        saved = configs.SILU_TABLE[t_class]
        configs.SILU_TABLE[t_class] = tile
        try:

            def run() -> None:
                for layer in self.ring:
                    act = self.backend.add_lora_silu_mul(
                        layer.y, layer.x, self.meta, layer.table.weights, self.ws
                    )
                    assert act is not None

            return graph_time_us(run) / RING
        finally:
            configs.SILU_TABLE[t_class] = saved


def sweep(cases: list[Case]) -> None:
    """Per T class: each candidate's geomean over the class's cases; install or null."""
    for t_class in sorted({configs.bucket(c.sc.rows, configs.T_BUCKETS) for c in cases}):
        mine = [c for c in cases if configs.bucket(c.sc.rows, configs.T_BUCKETS) == t_class]
        base = math.prod(c.unfused() for c in mine) ** (1 / len(mine))
        best, best_us = None, float("inf")
        for tile in CANDIDATES:
            try:
                us = math.prod(c.folded(tile) for c in mine) ** (1 / len(mine))
            except Exception as exc:  # a tile that does not compile here
                print(f"  T<={t_class} {tile}: failed {type(exc).__name__}: {exc}")
                continue
            print(f"  T<={t_class} {tile}: folded {us:.1f} µs vs add_lora + silu {base:.1f}")
            if us < best_us:
                best, best_us = tile, us
        win = best if best is not None and best_us < 0.97 * base else None
        print(f"silu T<={t_class}: {win} ({best_us:.1f} vs {base:.1f} µs)", flush=True)
        configs.SILU_TABLE[t_class] = win
        if t_class == 4096:
            configs.SILU_TABLE[1 << 30] = win


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    backend = TritonLoraBackend(fused=True)
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    cases = [Case(sc, backend) for sc in CASES]
    if args.sweep:
        sweep(cases)
        with open(os.path.join(args.out, "tuned_configs.json"), "w") as f:
            json.dump({"silu": configs.silu_table_json()}, f, indent=1)
    print(
        "| r | case | SiLU·mul alone | add_lora + SiLU·mul | **folded** "
        "| LoRA cost: unfused / folded |"
    )
    print("|---|---|---|---|---|---|")
    results = {}
    for c in cases:
        tile = configs.silu_config(c.sc.rows, c.sc.max_rank)
        t = {
            "silu only": c.act_only(),
            "add_lora + silu": c.unfused(),
            "folded": float("nan") if tile is None else c.folded(tile),
        }
        results[f"r{c.sc.max_rank} {c.sc.name}"] = t
        base = t["silu only"]
        print(
            f"| {c.sc.max_rank} | {c.sc.name} gate/up | {base:.1f} | "
            f"{t['add_lora + silu']:.1f} | **{t['folded']:.1f}** | "
            f"{t['add_lora + silu'] - base:.1f} / {t['folded'] - base:.1f} |",
            flush=True,
        )
    with open(os.path.join(args.out, "lora_silu.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
