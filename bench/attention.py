"""Micro benchmark: prefill attention of one layer, torch loop (SDPA per request) vs the Triton
varlen kernel, at Llama-3-8B head sizes (32 query / 8 KV heads, head_dim 128), bf16, paged KV
with block size 16 and scattered blocks.

Cases (rows per step = requests x chunk):
    8x512        8 fresh prompts of 512 tokens
    32x128       32 fresh prompts of 128 tokens
    8x512@1536   8 chunks of 512 rows after 1536 tokens of context (chunked prefill)
    8x512@1536 w1024  as 8x512@1536 with a 1024-token sliding window (Mistral layer)

Per case: median of `--iters` timed calls (CUDA events, after warm-up) of `paged_attention`
for one layer with each metadata kind, µs; TFLOP/s counts only the visible (causal) q·k and
p·v MACs. `sdpa-dense` (fresh, equal-length cases) is torch SDPA on a dense [B, H, L, D]
batch with is_causal (FlashAttention backend): a reference for what a tuned kernel reaches.
`meta` is the host time to build the step's metadata (once per step, shared by all layers).
`--sweep` also times the Triton kernel at other (block_m, block_n, warps, stages).

    python3 bench/attention.py                 # ~20 s on an H200
    python3 bench/attention.py --sweep --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.attention.kv_cache import PagedKVCache
from dataplane.attention.metadata import (
    AttentionMetadata,
    build_attention_metadata,
    prefill_batch,
)
from dataplane.attention.paged_attention import paged_attention
from dataplane.attention.triton_prefill import varlen_prefill_attention
from dataplane.core import BatchPlan, Sequence, build_batch_plan

HEADS, KV_HEADS, DIM, BS = 32, 8, 128, 16
CASES: list[tuple[str, int, int, int, int | None]] = [
    # name, requests, rows each, context before, window
    ("8x512", 8, 512, 0, None),
    ("32x128", 32, 128, 0, None),
    ("8x512@1536", 8, 512, 1536, None),
    ("8x512@1536 w1024", 8, 512, 1536, 1024),
]
SWEEP = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3),
         (128, 32, 8, 3), (128, 128, 8, 2)]


def make_plan(requests: int, rows: int, before: int) -> BatchPlan:
    """`requests` prefill chunks of `rows` rows after `before` computed tokens; blocks are
    handed out in a random order (scattered tables)."""
    per = (before + rows + BS - 1) // BS
    perm = torch.randperm(requests * per, generator=torch.Generator().manual_seed(0)).tolist()
    chunks = []
    for i in range(requests):
        s = Sequence(f"r{i}", tuple(range(1, before + rows + 1)))
        s.num_computed_tokens = before
        s.block_table = perm[i * per:(i + 1) * per]
        chunks.append((s, rows))
    return build_batch_plan(chunks, [], block_size=BS, generation=1, check=False)


def time_cuda(fn: Callable[[], object], iters: int) -> float:
    """Median µs of `iters` calls after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def run_case(name: str, requests: int, rows: int, before: int, window: int | None,
             iters: int, sweep: bool, dev: torch.device) -> list[dict[str, Any]]:
    plan = make_plan(requests, rows, before)
    t = plan.num_rows
    dt = torch.bfloat16
    cache = PagedKVCache(1, requests * ((before + rows + BS - 1) // BS), BS, KV_HEADS, DIM,
                         dt, dev)
    cache.k.normal_()
    cache.v.normal_()
    q = torch.randn(t, HEADS, DIM, dtype=dt, device=dev)
    k = torch.randn(t, KV_HEADS, DIM, dtype=dt, device=dev)
    v = torch.randn(t, KV_HEADS, DIM, dtype=dt, device=dev)
    windows = (window,)
    scale = DIM ** -0.5
    # Visible keys per row (causal, window), for the FLOP count.
    visible = sum(min(before + i + 1, window or 1 << 30) for i in range(rows)) * requests
    flops = 4 * visible * HEADS * DIM
    results = []

    def record(kind: str, us: float, **extra: Any) -> None:
        row = {"case": name, "kind": kind, "us": round(us, 1),
               "tflops": round(flops / us / 1e6, 1), **extra}
        results.append(row)
        print(json.dumps(row), flush=True)

    for kind in ("torch", "triton"):
        t0 = time.perf_counter()
        meta = build_attention_metadata(plan, windows, dev, cache.trash_slot, kind)
        torch.cuda.synchronize()
        meta_us = (time.perf_counter() - t0) * 1e6

        def layer(m: AttentionMetadata = meta) -> object:
            return paged_attention(q, k, v, 0, cache, m, window, scale, write_kv=False)

        us = time_cuda(layer, iters)
        record(kind, us, meta_us=round(meta_us, 1))
    if before == 0 and window is None:
        qd, kd, vd = (x.view(requests, rows, x.shape[1], DIM).transpose(1, 2) for x in (q, k, v))
        us = time_cuda(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True,
                                                              scale=scale, enable_gqa=True),
                       iters)
        record("sdpa-dense", us)
    if sweep:
        p = plan.num_prefills
        out = torch.empty_like(q)
        for block_m, block_n, warps, stages in SWEEP:
            batch = prefill_batch(plan.prefill_indptr, plan.context_lens[:p],
                                  plan.block_tables[:p], BS, dev, block_m=block_m)

            def call(b: Any = batch, bn: int = block_n, w: int = warps, s: int = stages
                     ) -> object:
                return varlen_prefill_attention(q, cache.k[0], cache.v[0], b, BS, scale,
                                                window, out=out, block_n=bn, num_warps=w,
                                                num_stages=s)

            us = time_cuda(call, iters)
            record("triton", us, config=[block_m, block_n, warps, stages])
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="also time other launch configs")
    ap.add_argument("--out", default=None, help="directory for attention_bench.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/attention.py needs CUDA")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"Hq={HEADS} Hkv={KV_HEADS} D={DIM} bf16 block_size={BS}", flush=True)
    results = []
    for case in CASES:
        results += run_case(*case, iters=args.iters, sweep=args.sweep, dev=dev)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "attention_bench.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
