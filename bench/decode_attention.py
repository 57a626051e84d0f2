"""Micro benchmark: the Triton paged decode attention kernel per split-KV config.

One layer of Llama-3-8B decode attention (head_dim 128, GQA 4 query heads per KV head,
bf16, block size 16, scattered blocks): `requests` rows, each over `context` cached keys,
with 8 KV heads (one GPU) or 4 (a TP=2 rank). For each (splits, block_n) config: the
median µs per call over CUDA-graph replays of 20 calls (`lora_timing.graph_time_us`),
against the floor of reading every row's K and V once at the copy bandwidth measured in
the same run (`lora_timing.copy_bandwidth`); every config's
output is checked against splits = 1. The row marked `auto` is the default launch:
`decode_splits`' choice with `BLOCK_N`-key tiles.

    python3 bench/decode_attention.py --out $OUT     # ~1 min on an H200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_timing import copy_bandwidth, graph_time_us
from dataplane.attention.triton_decode import BLOCK_N, decode_splits, paged_decode_attention

DIM, GROUP, BS = 128, 4, 16
CASES = [  # requests, context, KV heads
    (64, 512, 8), (64, 512, 4), (256, 512, 8), (128, 1024, 4),
    (64, 2048, 8), (16, 2048, 8), (16, 2048, 4), (256, 2048, 4),
]
CONFIGS = [(s, bn) for bn in (32, 64) for s in (1, 2, 4, 8, 16)]
CALLS = 20


def run_case(requests: int, context: int, kv_heads: int, bw: float) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    per_row = -(-context // BS)
    blocks = requests * per_row
    k = torch.randn(blocks * BS, kv_heads, DIM, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(requests, kv_heads * GROUP, DIM, device=dev, dtype=torch.bfloat16)
    tables = torch.randperm(blocks, device=dev, dtype=torch.int32).view(requests, per_row)
    lens = torch.full((requests,), context, device=dev, dtype=torch.int32)
    out = torch.empty_like(q)
    floor_us = 2 * requests * context * kv_heads * DIM * 2 / (bw * 1e3)
    ref = paged_decode_attention(q, k, v, tables, lens, lens - 1, BS, DIM ** -0.5, None,
                                 splits=1).float()
    auto = decode_splits(requests, kv_heads, dev)
    rows = []
    for splits, block_n in CONFIGS:
        def calls(s: int = splits, bn: int = block_n) -> None:
            for _ in range(CALLS):
                paged_decode_attention(q, k, v, tables, lens, lens - 1, BS, DIM ** -0.5,
                                       None, out=out, splits=s, block_n=bn)

        us = graph_time_us(calls) / CALLS
        err = (out.float() - ref).abs().max().item()
        rows.append({"requests": requests, "context": context, "kv_heads": kv_heads,
                     "splits": splits, "block_n": block_n, "us": us, "floor_us": floor_us,
                     "max_abs_diff_vs_1_split": err,
                     "auto": splits == auto and block_n == BLOCK_N})
        print(f"| {requests} × {context}, {kv_heads} KV heads | {splits} | {block_n} | "
              f"{us:.1f} | {us / floor_us:.2f}× | {err:.1e} |"
              f"{' auto' if rows[-1]['auto'] else ''}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for decode_attention.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/decode_attention.py needs CUDA")
    torch.manual_seed(0)
    bw = max(copy_bandwidth().values())
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}, copy {bw:.0f} GB/s")
    print("| case | splits | block_n | µs | / floor | max diff vs 1 split |")
    print("|---|---|---|---|---|---|")
    rows = []
    for case in CASES:
        rows += run_case(*case, bw)
        torch.cuda.empty_cache()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "decode_attention.json"), "w") as f:
            json.dump({"copy_GBps": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
