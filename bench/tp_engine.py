"""Engine-level decode step at TP=1 and TP=2, synchronous vs async scheduling.

`bench/tp.py` times hand-built plans through `Engine.execute_plan` (the device's part of
a step, and at TP handing the plan to the followers). A served step also has the host's
part: schedule, build the plan, sample, apply the tokens. This times what a user gets: the
interval between consecutive `Engine.step()` returns with `--batch` requests all decoding
at context ≈ `--context` (request i on adapter i % N), decode steps replayed from CUDA
graphs, for the engine at TP=1 and the TP leader (rank 0; the followers in `serve()`),
each with the synchronous loop and with async scheduling (the next step launched before
this one's tokens reach the host; at TP the tokens reach the followers by one device
broadcast per step).

    python3 bench/tp_engine.py --tp 1 2 --adapters 0 16 --out $OUT     # 2 GPUs
    python3 bench/tp_engine.py --shape tiny --device cpu --tp 1 2 --adapters 0 2 \
        --batch 4 --context 16 --steps 4 --out /tmp/tpe                # smoke (CPU, gloo)
    python3 bench/tp_engine.py --tp 1 --adapters 0 16 --fold --out $OUT          # 1 GPU

Every engine is built by `build_engine`: at TP=1 over the random base in memory; a TP
rank loads its shard of a random base of the same shape from a model directory (written
once under `--workdir`; a TP row's `build_s` includes that load). The adapters are pinned
in every rank's unified pool (`--kv-blocks` KV blocks plus their pages; a TP rank holds
its shard of each). `--fold` (bare: on; `auto`: the fold cost model) decides the LoRA
fold of the adapter cases (the engine's pool fold, on every rank).

`build_s`: the engine's construction, graph captures included (`--piecewise` adds the
mixed-step pieces, as a serving agent captures them). Adapters: random rank-16 all-linear
factors on the CPU (TP loads travel to the followers over the control channel), 16
distinct contents under distinct digests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.synthetic import (
    BLOCK_SIZE,
    adapters_for,
    start_decoding,
    step_intervals,
)
from bench.tp import DTYPES, SHAPES, checkpoint, model_args, rank_pages, run_ranks
from dataplane.engine import BaseModel, Engine, EngineConfig, EngineSpec, build_engine
from dataplane.engine.builder import FOLD_CHOICES
from dataplane.models import LlamaForCausalLM, ModelConfig, init_random
from dataplane.parallel import init_tp_group

DIGEST = hashlib.sha256(b"bench-tp-engine-random-base").hexdigest()


def engine_config(args: argparse.Namespace, n: int, mode: str, pages: int) -> EngineConfig:
    return EngineConfig(max_num_seqs=args.batch, max_num_batched_tokens=max(args.batch, 2048),
                        num_kv_blocks=pages, block_size=BLOCK_SIZE, max_slots=n, max_rank=16,
                        max_model_len=args.context + args.steps + 32,
                        enable_cuda_graphs=args.device == "cuda",
                        enable_piecewise_graphs=args.piecewise,
                        async_scheduling=mode == "async",
                        attention_backend="triton" if args.device == "cuda" else "torch")


def time_steps(engine: Engine, args: argparse.Namespace, handles: list[Any]) -> list[float]:
    start_decoding(engine, args, engine.model.config.vocab_size, args.batch, args.context,
                   handles)
    return step_intervals(engine, args.steps, args.device)


def bench_rank(rank: int, tp: int, init_file: str, args: argparse.Namespace,
               results_dir: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(tp, 1)))
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{rank}")
    config = ModelConfig.from_dict(dict(SHAPES[args.shape]))
    dtype = DTYPES[args.dtype]
    group = (init_tp_group(rank, tp, init_method=f"file://{init_file}", device=device)
             if tp > 1 else None)
    base = (BaseModel(init_random(LlamaForCausalLM(config, dtype, device), seed=0), DIGEST)
            if group is None else None)
    rows = []
    for n in args.adapters:
        for mode in args.scheduling:
            fold = args.fold if n else "off"
            loaded = adapters_for(config, n, dtype, "bench-tp-engine") if rank == 0 else []
            pages = rank_pages(config, dtype, tp, n, args.kv_blocks)
            built = time.perf_counter()
            if base is not None:
                engine = build_engine(EngineSpec(base, engine_config(args, n, mode, pages),
                                                 lora_fold=fold))
            else:
                engine = build_engine(EngineSpec(
                    args.model_dir, engine_config(args, n, mode, pages),
                    dtype=args.dtype, lora_fold=fold, tp_group=group))
                if rank > 0:  # follower: execute the leader's loads and plans until stop
                    engine.serve()
                    del engine
                    continue
            built = time.perf_counter() - built
            handles = [engine.register_loaded_adapter(a) for a in loaded]
            if group is not None:
                group.counter.reset()  # this engine's token broadcasts only
            times = time_steps(engine, args, handles)
            row = {"tp": tp, "adapters": n, "scheduling": mode,
                   "fold": engine.config.lora_fold, "async_on": engine.async_scheduling,
                   "overlapped_steps": engine.num_overlapped_steps,
                   "pool_pages": engine.pool.pool.pages.counts().total,
                   "build_s": built, "piecewise": args.piecewise,
                   "step_ms_p50": 1e3 * statistics.median(times),
                   "step_ms_mean": 1e3 * statistics.fmean(times),
                   "tokens_per_s": args.batch / statistics.median(times)}
            if engine.tp_group is not None:
                row["token_broadcasts"] = engine.tp_group.counter.calls("tokens")
                engine.shutdown()
            print(json.dumps(row), flush=True)
            rows.append(row)
            del engine, handles
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
    if rank == 0:
        (Path(results_dir) / f"tp{tp}.json").write_text(json.dumps(rows))
    if group is not None:
        import torch.distributed as dist

        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_args(p, [0, 16])
    p.add_argument("--scheduling", nargs="+", choices=("sync", "async"),
                   default=["sync", "async"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, default=4096,
                   help="KV blocks of each rank's pool (the adapters' pages come on top)")
    p.add_argument("--piecewise", action="store_true",
                   help="also capture mixed-step pieces (up to 2,048 rows) at build: its "
                        "time is in build_s; decode steps are timed either way")
    p.add_argument("--fold", nargs="?", choices=FOLD_CHOICES, const="on", default="off",
                   help="LoRA folded into the base GEMMs for decode steps (bare --fold: on)")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.model_dir = str(checkpoint(args)) if any(tp > 1 for tp in args.tp) else None
    rows: list[dict[str, Any]] = []
    for tp in args.tp:
        rows += run_ranks(bench_rank, tp, args)
    sync = {(r["tp"], r["adapters"]): r["step_ms_p50"] for r in rows
            if r["scheduling"] == "sync"}
    for r in rows:
        base = sync.get((r["tp"], r["adapters"]))
        if r["scheduling"] == "async" and base:
            r["speedup_vs_sync"] = base / r["step_ms_p50"]
    (args.out / "tp_engine.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                          for k, v in r.items()}))


if __name__ == "__main__":
    main()
