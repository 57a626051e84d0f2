"""One decode step of the engine against the HBM floor; or its host (Python) time alone.

Default: the median wall time of one decode step (`engine.step()`, host work included)
with `--max-num-seqs` requests all decoding at context ≈ `--prompt-max` (request i on
adapter i % N), for 0 and each `--adapters` N, against the HBM floor: (weights except the
embedding table + every request's KV + the step's distinct adapters' factors, each read
once) / `--bandwidth` GB/s. A step's time is the interval between consecutive
`engine.step()` returns (each returns after its step's tokens reached the host; no extra
device sync between steps, so async scheduling keeps its next step in flight as in
serving). `--scheduling` runs each case with the synchronous loop, the async one, or the
engine default (auto: async with CUDA graphs). Adapters: rank-16 all-linear, pinned in
the engine's unified pool (`--kv-blocks` KV blocks plus their pages).

`--host`: host time of one CUDA-graph decode step without the device: the tiny shape on
CPU; per step: schedule -> plan -> runner.check_plan -> CudaGraphRunner._fill (input
staging) -> greedy sample on stand-in logits [B, 16] -> postprocess -> request outputs.

    python bench/decode_step.py --max-num-seqs 64 --prompt-max 512 --adapters 16 128 \
        --kv-blocks 4096 --steps 20 --scheduling sync async      # one H200
    python bench/decode_step.py --host --max-num-seqs 64 --prompt-max 512 \
        --kv-blocks 4096 --adapters 128                          # host ms, CPU
    python bench/decode_step.py --shape tiny --device cpu --dtype float32 \
        --max-num-seqs 4 --prompt-max 16 --adapters 2 --kv-blocks 64 --steps 3   # smoke
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.synthetic import (
    BLOCK_SIZE,
    SHAPES,
    TINY_SHAPE,
    adapters_for,
    percentile,
    pool_pages,
    random_base,
    save_results,
    start_decoding,
    step_intervals,
    sync,
)
from dataplane.engine import BaseModel, Engine, EngineConfig, EngineSpec, build_engine
from dataplane.engine.builder import FOLD_CHOICES


def build(args: argparse.Namespace, base: BaseModel, n: int, max_rows: int, **config: object
          ) -> tuple[Engine, list]:
    """An engine over `base` with `n` pinned adapters (16 distinct contents) in its pool."""
    adapters = adapters_for(base.model.config, n, base.model.dtype, "random-adapter")
    cfg = EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=max_rows,
                       num_kv_blocks=pool_pages(base.model, adapters, args.kv_blocks),
                       block_size=BLOCK_SIZE, max_slots=n, max_rank=16,
                       max_model_len=args.prompt_max + args.steps + 32,
                       **config)  # type: ignore[arg-type]
    engine = build_engine(EngineSpec(base, cfg, lora_fold=args.fold if n else "off"))
    return engine, [engine.register_loaded_adapter(a) for a in adapters]


def device_main(args: argparse.Namespace) -> list[dict]:
    dev, dtype = args.device, getattr(torch, args.dtype)
    base = random_base(SHAPES[args.shape], dtype, dev)
    model, config = base.model, base.model.config
    batch, ctx = args.max_num_seqs, args.prompt_max
    elem = dtype.itemsize
    weights = sum(p.numel() for p in model.parameters()) * elem
    if not config.tie_word_embeddings:
        weights -= model.embed_tokens.weight.numel() * elem
    kv = batch * (ctx + args.steps // 2) * config.num_layers * 2 * config.kv_size * elem
    per_adapter = 16 * sum(i + o for o, i in config.module_shapes.values()) * config.num_layers
    results = []
    for n, mode in [(n, mode) for n in [0, *args.adapters] for mode in args.scheduling]:
        engine, handles = build(args, base, n, max(batch, 2048),
                                async_scheduling={"sync": False, "async": True}.get(mode))
        scheduling = "async" if engine.async_scheduling else "sync"
        start_decoding(engine, args, config.vocab_size, batch, ctx, handles)
        times = step_intervals(engine, args.steps, dev)
        floor = (weights + kv + min(n, batch) * per_adapter * elem) / (args.bandwidth * 1e9)
        step = percentile(times, 50)
        results.append({"system": f"decode step B={batch} ctx~{ctx} ({scheduling})",
                        "adapters": n, "scheduling": scheduling, "fold": engine.config.lora_fold,
                        "step_ms": 1e3 * step, "mean_step_ms": 1e3 * sum(times) / len(times),
                        "floor_ms": 1e3 * floor, "ratio": step / floor,
                        "overlapped_steps": engine.num_overlapped_steps})
        print(f"# decode step n={n} {scheduling}: {1e3 * step:.2f} ms "
              f"(floor {1e3 * floor:.2f} ms)", file=sys.stderr, flush=True)
        sync(dev)  # an async engine still has its next step in flight
        del engine, handles
        if dev == "cuda":
            torch.cuda.empty_cache()
    return results


def host_main(args: argparse.Namespace) -> list[dict]:
    from dataplane.engine.cuda_graphs import CudaGraphRunner

    base = random_base(TINY_SHAPE, torch.float32, "cpu", tag="tiny")
    config = base.model.config
    batch, ctx = args.max_num_seqs, args.prompt_max
    results = []
    for n in [0, *args.adapters]:
        engine, handles = build(args, base, n, max(batch, 8192))
        start_decoding(engine, args, config.vocab_size, batch, ctx, handles)
        graphs = CudaGraphRunner(engine.runner, batch, ctx + args.steps + 32)
        stand_in = torch.randn(batch, 16)
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            out = engine.scheduler.schedule()
            plan = engine.build_plan(out)
            engine.runner.check_plan(plan)
            graphs._fill(plan, next(b for b in graphs.batch_sizes if b >= plan.num_rows), None)
            result = engine.sampler.sample(stand_in[:plan.num_rows], out.sampled)
            for u in engine.scheduler.postprocess(out, result.token_ids):
                engine._output(u.seq, (u.token_id,), u.text)
            times.append(time.perf_counter() - t0)
        step = percentile(times, 50)
        results.append({"system": f"host step B={batch} ctx~{ctx} (CPU)", "adapters": n,
                        "step_ms": 1e3 * step, "floor_ms": float("nan"), "ratio": float("nan")})
        print(f"# host step n={n}: {1e3 * step:.3f} ms", file=sys.stderr, flush=True)
        del engine, graphs, handles  # the next engine takes the same model
    return results


def markdown(results: list[dict]) -> str:
    lines = ["| case | adapters | step (ms) | floor (ms) | step / floor |", "|---|---|---|---|---|"]
    lines += [f"| {r['system']} | {r['adapters']} | {r['step_ms']:.2f} | {r['floor_ms']:.2f} | "
              f"{r['ratio']:.2f} |" for r in results]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", action="store_true",
                   help="host (Python) time of a graph-path step, tiny shape on CPU")
    p.add_argument("--adapters", type=int, nargs="+", default=[1, 16, 128])
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests decoding together")
    p.add_argument("--prompt-max", type=int, default=512, help="their context")
    p.add_argument("--kv-blocks", type=int, default=4096,
                   help="KV blocks (the pool adds the adapters' pages)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--scheduling", nargs="+", choices=("auto", "sync", "async"),
                   default=["auto"], help="engine loop(s) to measure (auto: the engine default)")
    p.add_argument("--fold", nargs="?", choices=FOLD_CHOICES, const="on", default="off",
                   help="the LoRA fold of the adapter cases (bare --fold: on)")
    p.add_argument("--bandwidth", type=float, default=4073.0,
                   help="HBM GB/s for the floor (H200)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for decode_step.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = (host_main if args.host else device_main)(args)
    print(markdown(results))
    save_results(args.out, "decode_step.json", args, results)


if __name__ == "__main__":
    main()
