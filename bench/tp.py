"""Tensor-parallel benchmark: TP=2 vs TP=1 decode, prefill and mixed steps, 0/16/128 adapters.

Llama-3-8B shape (hidden 4096, 32 layers, 32 heads / 8 kv heads, MLP 14336, vocab 128256;
`--shape tiny` for CPU smoke runs), random weights, rank-16 adapters on every projection
(q/k/v/o/gate/up/down; 16 distinct contents, a digest each). For each (TP degree, adapter
count, fold, phase, mode) a row reports the throughput, the median step time and, at
TP > 1, rank 0's collective calls / payload bytes / ring bytes per step
(`dataplane.parallel.collectives`) of the base path ("base": 2 x layers + 2 calls) and of
the LoRA ("lora": none, a rank's adapter shards need no collective).

Every rank runs the product's engine, built by `build_engine` once per (adapter count,
fold, graph mode): at TP=1 over the random base in memory; at TP > 1 (one spawned process
per device, NCCL on CUDA, gloo on CPU) each rank's shard of a model directory of the same
random base, written once under `--workdir`. Rank 0 leads: it loads the adapters
(`register_loaded_adapter`: each rank's shard pinned in its unified pool, which holds
`--kv-blocks` KV blocks besides) and drives hand-built plans through
`Engine.execute_plan`, which hands each plan to the followers (in `serve()`) before
executing it. The plans' KV blocks come from the leader's pool.

Decode: `--batch` requests of `--context` prompt tokens, prefilled once, then `--steps`
timed decode steps (adapter of request i = i % n, or with `--zipf S` drawn from Zipf(S)
popularity over the n adapters; rows report "distinct_adapters"). Prefill:
`--prefill-requests` prompts of `--prefill-len` tokens in one step. Mixed: the decode
requests' next tokens and `--mixed-prompts` prompts of `--mixed-prompt-len` tokens in one
step (64 + 4 x 128 = 576 rows by default, a typical serving step).

`--graphs eager|graphs|both`: decode steps run eagerly and/or replayed from CUDA graphs
(`CudaGraphRunner`, the `--batch` size only, context up to the last step's; a TP rank's
graph holds its NCCL collectives and each replay counts them). Prefill and mixed steps run
eagerly, and with `--piecewise` also as piecewise CUDA graphs (`PiecewiseGraphRunner`, one
bucket per row count; with `--graphs graphs --piecewise` only that way). Every rank captures
the same graphs right after building its engine, before any adapter is loaded; rows
report "graph_replays" / "piecewise_runs", or off CUDA (or when a capture fails)
"graphs_error" instead of timings.

`--fold`: each adapter case again with the LoRA folded into the base GEMMs and their
consumer ops for decode steps (the engine's pool fold; rows "fold": true; decode rows also
time copying the adapters the fold lacks into it on rank 0, "fold_fill_ms").
`--profile N` profiles N more decode steps per decode row on rank 0 (CUDA): device µs per
step by kernel kind, and the top kernels. The "keep" lines printed at the end: decode and
mixed tok/s of each LoRA row over the no-LoRA row of the same TP degree, phase and mode.

    python bench/tp.py --out $OUT --graphs both         # on nvidia-h200-x2 (both GPUs)
    python bench/tp.py --shape tiny --device cpu --tp 1 2 --adapters 0 4 --steps 2 \
        --batch 4 --context 16 --prefill-requests 2 --prefill-len 16 --kv-blocks 64 \
        --out /tmp/tp                                    # smoke (tests/parallel runs it)

Rows: `<out>/tp_bench.json` (`save_results`: the arguments and the rows), and
`<out>/tp_rows.jsonl` as they come (survives a timeout).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.synthetic import (
    LLAMA3_8B,
    TINY_SHAPE,
    adapters_for,
    pool_pages,
    random_adapter,
    save_results,
    write_checkpoint,
)
from bench.tp_profile import BLOCK, profile_decode, sync
from dataplane.core import Sequence, build_batch_plan
from dataplane.engine import BaseModel, Engine, EngineConfig, EngineSpec, build_engine
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.cuda_graphs import CudaGraphRunner
from dataplane.engine.piecewise_graphs import PiecewiseGraphRunner
from dataplane.kvcache.page_pool import PageKind
from dataplane.models import ModelConfig, init_random
from dataplane.models.llama import LlamaForCausalLM
from dataplane.parallel import TPGroup, init_tp_group
from dataplane.parallel.shard_model import local_config, shard_adapter

SHAPES: dict[str, dict[str, Any]] = {"8b": LLAMA3_8B, "tiny": TINY_SHAPE}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DIGEST = hashlib.sha256(b"bench-tp-random-base").hexdigest()
ADAPTER_RANK = 16  # `adapters_for`'s
NO_GRAPHS = "CUDA graphs need a CUDA device and a graph-safe LoRA backend"


def checkpoint(args: argparse.Namespace) -> Path:
    """The TP ranks' model directory: a random base of `--shape` in `--dtype` under
    `--workdir` (made on the CPU once, then reused)."""
    dest = Path(args.workdir) / f"base-{args.shape}-{args.dtype}"
    if (dest / "model.safetensors").is_file():
        return dest
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    config = ModelConfig.from_dict(dict(SHAPES[args.shape]))
    model = init_random(LlamaForCausalLM(config, DTYPES[args.dtype], torch.device("cpu")),
                        seed=0)
    write_checkpoint(model, SHAPES[args.shape], partial)
    partial.rename(dest)
    return dest


def rank_pages(config: ModelConfig, dtype: torch.dtype, tp: int, adapters: int,
               kv_blocks: int) -> int:
    """`EngineConfig.num_kv_blocks` of a TP rank's unified pool: `kv_blocks` KV blocks plus
    the pages of `adapters` rank-16 adapters' shards (the same on every rank)."""
    if not adapters:
        return kv_blocks
    local = LlamaForCausalLM(local_config(config, tp), dtype, torch.device("meta"))
    shard = shard_adapter(random_adapter(config, ADAPTER_RANK, 0, "cpu", dtype), config, 0, tp)
    return pool_pages(local, [shard] * adapters, kv_blocks, BLOCK)


def request_adapters(requests: int, n_adapters: int, zipf: float) -> list[int]:
    """Adapter of each request: i % n (`zipf` 0), or drawn from Zipf(`zipf`) popularity
    over the n adapters (adapter k with weight 1 / (k + 1)^zipf, a fixed seed); -1 without."""
    if not n_adapters:
        return [-1] * requests
    if zipf <= 0:
        return [i % n_adapters for i in range(requests)]
    weights = torch.arange(1, n_adapters + 1, dtype=torch.float64).pow(-zipf)
    gen = torch.Generator().manual_seed(1234)
    return torch.multinomial(weights, requests, replacement=True, generator=gen).tolist()


def phase_shape(args: argparse.Namespace, phase: str) -> tuple[int, int, int, int]:
    """(decode requests, their context, prompts prefilled per step, prompt length)."""
    if phase == "decode":
        return args.batch, args.context, 0, 0
    if phase == "prefill":
        return 0, 0, args.prefill_requests, args.prefill_len
    return args.batch, args.context, args.mixed_prompts, args.mixed_prompt_len


def phase_rows(args: argparse.Namespace, phase: str) -> int:
    dec, _, pre, pre_len = phase_shape(args, phase)
    return dec + pre * pre_len


def decode_width(args: argparse.Namespace) -> int:
    """Context of a decode request at its last step (timed and profiled ones)."""
    return args.context + args.steps + args.profile + 3


def run_phase(engine: Engine, handles: list[AdapterHandle], args: argparse.Namespace,
              phase: str) -> dict[str, Any]:
    """Time one phase on the leader; returns its row (step times, rank 0's per-step
    collective ledger). decode: the decode requests, one token each per step; prefill:
    the prompts, whole, per step; mixed: both in one step (the prompts prefilled again
    every step). Request i's adapter is handle `request_adapters(...)[i]`."""
    group, device = engine.tp_group, engine.runner.device
    dec_n, context, pre_n, pre_len = phase_shape(args, phase)
    steps = args.steps if phase == "decode" else args.prefill_steps
    vocab = min(1003, engine.model.config.vocab_size)
    per_seq_blocks = -(-(max(context + args.profile, pre_len) + steps + 3) // BLOCK)
    adapter_of = request_adapters(dec_n + pre_n, len(handles), args.zipf)
    blocks = engine.pool.kv_view.allocate((dec_n + pre_n) * per_seq_blocks, PageKind.KV)

    def make(i: int, prompt_len: int) -> Sequence:
        h = handles[adapter_of[i]] if adapter_of[i] >= 0 else None
        prompt = tuple((7 * i + 13 * t) % (vocab - 3) + 3 for t in range(prompt_len))
        seq = Sequence(f"r{i}", prompt, adapter_slot=-1 if h is None else h.slot,
                       adapter_digest=None if h is None else h.digest)
        seq.block_table.extend(blocks[i * per_seq_blocks: (i + 1) * per_seq_blocks])
        return seq

    def advance() -> None:
        for s in seqs:
            s.num_computed_tokens = s.num_tokens
            s.token_ids.append(5)

    seqs = [make(i, context) for i in range(dec_n)]
    prompts = [make(dec_n + i, pre_len) for i in range(pre_n)]
    per_step = max(1, engine.runner.max_rows // max(context, 1))
    for lo in range(0, dec_n, per_step):  # prefill once, untimed, as many as fit a step
        engine.execute_plan(build_batch_plan([(s, s.num_tokens) for s in seqs[lo:lo + per_step]],
                                             [], block_size=BLOCK, generation=0, check=False),
                            None)
    advance()
    times, ledger = [], None
    for step in range(steps + 1):  # step 0 warms up
        for s in prompts:
            s.num_computed_tokens = 0
        plan = build_batch_plan([(s, s.num_tokens) for s in prompts], seqs, block_size=BLOCK,
                                generation=step + 1, check=False)
        if group is not None:
            group.counter.reset()
        sync(device)
        t0 = time.perf_counter()
        engine.execute_plan(plan, None)
        sync(device)
        if step:
            times.append(time.perf_counter() - t0)
        if group is not None and step:
            c = group.counter
            ledger = {p: {"calls": c.calls(p), "payload_bytes": c.payload_bytes(p),
                          "ring_bytes": float(c.ring_bytes(p))} for p in ("base", "lora")}
        advance()
    kernels = None
    if phase == "decode" and args.profile and device.type == "cuda":
        # rank 0 alone records; the followers run the same steps through `serve()`
        kernels = profile_decode(lambda plan: engine.execute_plan(plan, None),
                                 engine.runner.device, seqs, args.profile, steps + 1)
    engine.pool.kv_view.free(blocks, PageKind.KV)
    med = statistics.median(times)
    return {"phase": phase, "requests": dec_n + pre_n, "prompt_len": pre_len or context,
            "rows_per_step": dec_n + pre_n * pre_len,
            "distinct_adapters": len({a for a in adapter_of if a >= 0}),
            "median_step_ms": 1e3 * med, "tokens_per_s": (dec_n + pre_n * pre_len) / med,
            "collectives_per_step": ledger,
            **({"kernels": kernels} if kernels is not None else {})}


def time_fold_fill(model: LlamaForCausalLM, device: torch.device) -> dict[str, Any]:
    """Time to copy the resident adapters the fold does not hold into it, as many as it
    holds (a step whose every row brings an adapter the fold lacks). Rank 0 only, after
    the engine's last step (the followers' folds are not filled)."""
    slots = model.lora_fold_slots
    if slots is None:
        return {}
    seen = {"fold_slots": slots.fold_slots, "fold_capacity": slots.capacity,
            "fold_width_steps": {w: n for w, n in slots.width_steps.items() if n}}
    idle = [s for s in range(slots.table_slots) if slots.holder(s) < 0][:slots.fold_slots]
    if not idle:
        return seen
    sync(device)
    t0 = time.perf_counter()
    slots.rows(idle)
    sync(device)
    return {**seen, "fold_fill_adapters": len(idle),
            "fold_fill_ms": 1e3 * (time.perf_counter() - t0)}


def capture(engine: Engine, args: argparse.Namespace, decode: bool, pieces: bool
            ) -> str | None:
    """Every rank, before any adapter is loaded: the decode graph of `--batch` rows and/or
    the piecewise graphs of the prefill and mixed row counts (the same on every rank, so
    their collectives match during capture and replay); None or the error text."""
    runner, group = engine.runner, engine.tp_group
    if runner.device.type != "cuda" or not runner.graph_safe:
        return NO_GRAPHS
    try:
        runner.warm_up_lora()
        if decode:
            graphs = CudaGraphRunner(runner, args.batch, decode_width(args),
                                     batch_sizes=(args.batch,), group=group)
            graphs.capture_all()
            runner.graphs = graphs
        if pieces:
            buckets = tuple(sorted({phase_rows(args, "prefill"), phase_rows(args, "mixed")}))
            piecewise = PiecewiseGraphRunner(runner, buckets[-1], buckets=buckets, group=group)
            piecewise.capture_all()
            runner.piecewise = piecewise
    except Exception as exc:  # reported in the rows, the eager ones still stand
        engine.release_graphs()
        return f"{type(exc).__name__}: {exc}"[:500]
    return None


def engine_runs(args: argparse.Namespace) -> list[tuple[str, list[tuple[str, str]]]]:
    """(graph kind, its (phase, mode) runs) of the engines each adapter case builds."""
    modes = ["eager", "graphs"] if args.graphs == "both" else [args.graphs]
    out: list[tuple[str, list[tuple[str, str]]]] = []
    if "eager" in modes:
        out.append(("eager", [("decode", "eager"), ("prefill", "eager"), ("mixed", "eager")]))
    runs = [("decode", "graphs")] if "graphs" in modes else []
    if args.piecewise:
        runs += [("prefill", "piecewise"), ("mixed", "piecewise")]
    elif "eager" not in modes:  # no pieces: these run eagerly beside the decode graph
        runs += [("prefill", "eager"), ("mixed", "eager")]
    if runs:
        out.append(("graphs", runs))
    return out


def build_rank_engine(args: argparse.Namespace, group: TPGroup | None, device: torch.device,
                      n: int, fold: bool) -> Engine:
    config = ModelConfig.from_dict(dict(SHAPES[args.shape]))
    dtype = DTYPES[args.dtype]
    tp = 1 if group is None else group.size
    max_rows = max(args.batch, args.context, phase_rows(args, "prefill"),
                   phase_rows(args, "mixed"))
    cfg = EngineConfig(max_num_seqs=args.batch, max_num_batched_tokens=max_rows,
                       num_kv_blocks=rank_pages(config, dtype, tp, n, args.kv_blocks),
                       block_size=BLOCK, max_slots=n, max_rank=ADAPTER_RANK,
                       enable_cuda_graphs=False, enable_piecewise_graphs=False,
                       attention_backend=args.attention, async_scheduling=False)
    fold_on = "on" if fold and args.fold_width_unit is None else "off"
    if group is None:  # a fresh base: an engine's fold stays on the model it folds
        base = BaseModel(init_random(LlamaForCausalLM(config, dtype, device), seed=0), DIGEST)
        engine = build_engine(EngineSpec(base, cfg, lora_fold=fold_on))
    else:
        engine = build_engine(EngineSpec(args.model_dir, cfg, dtype=args.dtype,
                                         lora_fold=fold_on, tp_group=group))
    if fold and args.fold_width_unit is not None:
        engine.pool.enable_fold(args.fold_width_unit)
    return engine


def lead(engine: Engine, args: argparse.Namespace, adapters: list[LoadedAdapter],
         runs: list[tuple[str, str]], error: str | None, row_keys: dict[str, Any]
         ) -> list[dict[str, Any]]:
    """Rank 0: load the case's adapters, time its runs, release the followers."""
    handles = [engine.register_loaded_adapter(a) for a in adapters]
    case: list[dict[str, Any]] = []
    for phase, mode in runs:
        if mode != "eager" and error is not None:
            case.append({"phase": phase, "mode": mode, **row_keys, "graphs_error": error})
            continue
        graphs, pieces = engine.runner.graphs, engine.runner.piecewise
        replays, piece_runs = getattr(graphs, "replays", 0), getattr(pieces, "runs", 0)
        row = {**run_phase(engine, handles, args, phase), "mode": mode, **row_keys}
        if mode == "graphs":
            row["graph_replays"] = getattr(graphs, "replays", 0) - replays
        if mode == "piecewise":
            row["piecewise_runs"] = getattr(pieces, "runs", 0) - piece_runs
        case.append(row)
    if row_keys["fold"]:  # after the engine's last step
        fill = time_fold_fill(engine.model, engine.runner.device)
        for row in case:
            if row["phase"] == "decode" and "graphs_error" not in row:
                row.update(fill)
    engine.shutdown()
    return case


def bench_rank(rank: int, tp: int, init_file: str, args: argparse.Namespace,
               results_dir: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(tp, 1)))
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{rank}")
    group = (init_tp_group(rank, tp, init_method=f"file://{init_file}", device=device)
             if tp > 1 else None)
    config = ModelConfig.from_dict(dict(SHAPES[args.shape]))
    adapters = (adapters_for(config, max(args.adapters), DTYPES[args.dtype], "bench-tp")
                if rank == 0 else [])  # case n loads the first n (the followers: shards)
    rows: list[dict[str, Any]] = []

    def emit(case: list[dict[str, Any]]) -> None:
        rows.extend(case)
        for row in case if rank == 0 else ():
            print(json.dumps(row), flush=True)
            with (args.out / "tp_rows.jsonl").open("a") as f:  # survives a timeout
                f.write(json.dumps(row) + "\n")

    for n in args.adapters:
        for fold in (False, True) if args.fold and n else (False,):
            for kind, runs in engine_runs(args):
                row_keys = {"tp": tp, "fold": fold, "adapters": n, "rank": ADAPTER_RANK,
                            "zipf": args.zipf, "shape": args.shape, "dtype": args.dtype}
                if kind == "graphs" and device.type != "cuda":  # no engine to build
                    emit([{"phase": phase, "mode": mode, **row_keys, "graphs_error": NO_GRAPHS}
                          for phase, mode in runs if mode != "eager"])
                    runs = [(phase, mode) for phase, mode in runs if mode == "eager"]
                    if not runs:
                        continue
                engine = build_rank_engine(args, group, device, n, fold)
                error = (capture(engine, args, ("decode", "graphs") in runs, args.piecewise)
                         if kind == "graphs" else None)
                if rank == 0:
                    emit(lead(engine, args, adapters[:n], runs, error, row_keys))
                else:  # follower: execute the leader's loads and plans until it stops
                    engine.serve()
                del engine
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if rank == 0:
        (Path(results_dir) / f"tp{tp}.json").write_text(json.dumps(rows, indent=1))
    if group is not None:
        import torch.distributed as dist

        dist.destroy_process_group()


def run_ranks(fn: Callable[..., None], tp: int, args: argparse.Namespace
              ) -> list[dict[str, Any]]:
    """`fn(rank, tp, rendezvous file, args, results dir)` on `tp` ranks (this process for
    TP=1, spawned processes otherwise); returns the rows rank 0 wrote to
    `<results dir>/tp<tp>.json`."""
    with tempfile.TemporaryDirectory() as tmp:
        if tp == 1:
            fn(0, 1, str(Path(tmp) / "rdv"), args, tmp)
        else:
            mp.start_processes(fn, args=(tp, str(Path(tmp) / "rdv"), args, tmp), nprocs=tp,
                               join=True, start_method="spawn")
        rows: list[dict[str, Any]] = json.loads((Path(tmp) / f"tp{tp}.json").read_text())
    return rows


def keep_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decode (and mixed-step) tok/s of each LoRA row over the same TP degree, phase and
    mode without LoRA."""
    timed = [r for r in rows if r["phase"] in ("decode", "mixed") and "tokens_per_s" in r]
    base = {(r["tp"], r["phase"], r["mode"]): r["tokens_per_s"]
            for r in timed if r["adapters"] == 0}
    return [{"keep": round(r["tokens_per_s"] / base[key], 3), "tp": r["tp"],
             "phase": r["phase"], "mode": r["mode"], "fold": r["fold"],
             "adapters": r["adapters"]}
            for r in timed if r["adapters"] and (key := (r["tp"], r["phase"], r["mode"])) in base]


def model_args(p: argparse.ArgumentParser, adapters: list[int]) -> None:
    """--shape, --device, --dtype, --tp, --adapters and --workdir (TP benchmarks share
    them)."""
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--adapters", type=int, nargs="+", default=adapters)
    p.add_argument("--workdir", default="/tmp/adapterplane-bench-tp",
                   help="TP > 1: where the random base's model directory is kept")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_args(p, [0, 16, 128])
    p.add_argument("--zipf", type=float, default=0.0,
                   help="request adapters drawn from Zipf(s) popularity (0: request i "
                        "uses adapter i %% n)")
    p.add_argument("--batch", type=int, default=64, help="decode requests")
    p.add_argument("--context", type=int, default=512, help="decode prompt tokens")
    p.add_argument("--steps", type=int, default=20, help="timed decode steps")
    p.add_argument("--prefill-requests", type=int, default=8)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--prefill-steps", type=int, default=3)
    p.add_argument("--mixed-prompts", type=int, default=4,
                   help="prompts prefilled next to the --batch decode rows in a mixed step")
    p.add_argument("--mixed-prompt-len", type=int, default=128)
    p.add_argument("--piecewise", action="store_true",
                   help="also run the prefill and mixed steps as piecewise CUDA graphs")
    p.add_argument("--kv-blocks", type=int, default=4096,
                   help="KV blocks of each rank's pool (the adapters' pages come on top)")
    p.add_argument("--fold", action="store_true",
                   help="each adapter case again with the LoRA folded into the base GEMMs "
                        "and their consumer ops for decode steps")
    p.add_argument("--fold-width-unit", type=int, default=None,
                   help="fold widths in multiples of this many slots (default: FoldSlots'; "
                        "--batch: one width, every fold slot read every step)")
    p.add_argument("--attention", choices=("torch", "triton"), default=None)
    p.add_argument("--graphs", choices=("eager", "graphs", "both"), default="eager",
                   help="decode steps eager, replayed from CUDA graphs, or both")
    p.add_argument("--profile", type=int, default=0,
                   help="decode steps to profile after the timed ones (torch.profiler, rank 0)")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    if args.device == "cpu":
        args.attention = "torch"
    args.out.mkdir(parents=True, exist_ok=True)
    args.model_dir = str(checkpoint(args)) if any(tp > 1 for tp in args.tp) else None
    rows: list[dict[str, Any]] = []
    for tp in args.tp:
        rows += run_ranks(bench_rank, tp, args)
    save_results(str(args.out), "tp_bench.json", args, rows)
    for line in keep_ratios(rows):
        print(json.dumps(line))
    print(json.dumps({"written": str(args.out / "tp_bench.json"), "rows": len(rows)}))


if __name__ == "__main__":
    main()
