"""Activated LoRA on a shared conversation: TTFT and prefill work vs ordinary LoRA and base.

One engine (prefix caching on) with N rank-16 all-linear adapters served twice, as
activated LoRAs (invocation tokens `INVOKE`) and as ordinary LoRAs of the same factors.
For each context length T_cache in `--contexts` and each N in `--n`:

1. a base request on the context alone (it leaves the context's full blocks cached; not
   measured);
2. `base`: N base requests at once, each context + T_new new tokens of its own (the
   context is cached: the floor an aLoRA round can reach);
3. `alora`: the same N prompts, request i on aLoRA i; the new tokens start with the
   invocation, so the rows before it are base rows and the cached context is reused;
4. `lora`: the same N requests on the ordinary LoRAs (adapted from position 0: the whole
   prompt is computed).

Each request generates `--max-tokens` tokens (1 by default: TTFT is the request's whole
time). Every request of a round arrives at once; TTFT is arrival to first token, reported
as the mean and max over the round. Prefill work = the prompt tokens computed (prompt -
cached, from `RequestOutput.num_cached_tokens`), and its linear-layer FLOPs 2 * params *
tokens. Every context is fresh random tokens, so nothing crosses rounds. Results:
`--out`/alora.json.

    python bench/alora.py --contexts 256 1024 --n 1 4 16                        # CPU, tiny
    python bench/alora.py --shape llama3-8b --device cuda --dtype bfloat16 \\
        --contexts 1024 4096 --n 1 4 16 --max-batched-tokens 8192 --kv-blocks 8192 --out $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.synthetic import (
    BLOCK_SIZE,
    SHAPES,
    adapters_for,
    add_serving_args,
    pool_pages,
    random_base,
    save_results,
    sync,
)
from dataplane.core import SamplingParams
from dataplane.engine import Engine, EngineSpec, build_engine
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.builder import DTYPES

INVOKE = (3, 4, 5)


def aloras(adapters: list[LoadedAdapter]) -> list[LoadedAdapter]:
    """The same factors as activated LoRAs, each under a digest of its own."""
    return [dataclasses.replace(a, invocation_tokens=INVOKE, digest=hashlib.sha256(
        f"alora-{a.digest}".encode()).hexdigest()) for a in adapters]


def linear_params(engine: Engine) -> int:
    """Parameters of the base's linear projections (what a prompt token multiplies)."""
    c = engine.model.config
    return c.num_layers * sum(d_out * d_in for d_out, d_in in c.module_shapes.values())


def run_round(engine: Engine, prompts: list[list[int]], handles: list[AdapterHandle | None],
              max_tokens: int, device: str, label: str) -> dict[str, float]:
    """Every request at once; mean / max TTFT (ms) and prompt tokens computed."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    sync(device)
    start = time.perf_counter()
    for i, (prompt, handle) in enumerate(zip(prompts, handles, strict=True)):
        engine.add_request(f"{label}-{i}", prompt, params, handle)
    first: dict[str, float] = {}
    computed = 0
    while engine.has_unfinished():
        outs = engine.step()
        sync(device)
        now = time.perf_counter()
        for out in outs:
            if out.request_id not in first:
                first[out.request_id] = now - start
                computed += len(out.prompt_token_ids) - out.num_cached_tokens
    ttfts = list(first.values())
    return {"ttft_mean_ms": 1e3 * sum(ttfts) / len(ttfts), "ttft_max_ms": 1e3 * max(ttfts),
            "computed_tokens": computed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_serving_args(p)
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--n", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--new-tokens", type=int, default=32, help="T_new (invocation included)")
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.set_defaults(max_batched_tokens=4096, kv_blocks=1024, max_num_seqs=32)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n_max = max(args.n)
    base = random_base(SHAPES[args.shape], DTYPES[args.dtype], args.device, seed=args.seed)
    plain = adapters_for(base.model.config, n_max, DTYPES[args.dtype], "alora-bench")
    activated = aloras(plain)
    engine = build_engine(EngineSpec.of(
        base, dtype=args.dtype, device=args.device, max_slots=2 * n_max, max_rank=16,
        num_kv_blocks=pool_pages(base.model, plain + activated, args.kv_blocks),
        block_size=BLOCK_SIZE, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens, enable_prefix_caching=True))
    lora_h = [engine.register_loaded_adapter(a) for a in plain]
    alora_h = [engine.register_loaded_adapter(a) for a in activated]
    vocab = base.model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    flops_per_token = 2 * linear_params(engine)

    def fresh(n: int) -> list[int]:
        return torch.randint(10, vocab, (n,), generator=gen).tolist()

    # warm-up: kernels, graphs and allocator at this round's shapes, on a throwaway context
    warm = fresh(args.contexts[0])
    run_round(engine, [warm], [None], 1, args.device, "warm-base")
    run_round(engine, [[*warm, *INVOKE, *fresh(args.new_tokens - len(INVOKE))]] * 2,
              [alora_h[0], lora_h[0]], 1, args.device, "warm")
    results = []
    for t_cache in args.contexts:
        for n in args.n:
            context = fresh(t_cache)
            tails = [[*INVOKE, *fresh(args.new_tokens - len(INVOKE))] for _ in range(n)]
            prompts = [[*context, *tail] for tail in tails]
            run_round(engine, [context], [None], 1, args.device, f"ctx{t_cache}-{n}")
            row: dict[str, object] = {"t_cache": t_cache, "n": n, "t_new": args.new_tokens}
            for label, handles in (("base", [None] * n), ("alora", alora_h[:n]),
                                   ("lora", lora_h[:n])):
                got = run_round(engine, prompts, list(handles),
                                args.max_tokens, args.device, f"{label}-{t_cache}-{n}")
                got["prefill_gflop"] = flops_per_token * got["computed_tokens"] / 1e9
                row[label] = got
            a, lo, b = row["alora"], row["lora"], row["base"]
            assert isinstance(a, dict) and isinstance(lo, dict) and isinstance(b, dict)
            row["lora_over_alora_ttft_max"] = lo["ttft_max_ms"] / a["ttft_max_ms"]
            row["alora_over_base_ttft_max"] = a["ttft_max_ms"] / b["ttft_max_ms"]
            print(row, flush=True)
            results.append(row)
    save_results(args.out, "alora.json", args, results)
    engine.shutdown()


if __name__ == "__main__":
    main()
