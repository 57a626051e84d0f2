"""Tensor-parallel benchmark: TP=2 vs TP=1 decode/prefill throughput with 0/16/128 adapters.

8B-shaped (Llama-3-8B: hidden 4096, 32 layers, 32 heads / 8 kv heads, MLP 14336, vocab
128256) random bf16 weights, rank-16 adapters on every projection (q/k/v/o/gate/up/down).
For each (TP degree, LoRA layout, adapter count, phase) the script reports throughput,
the median step time and the collective calls / payload bytes / ring bytes per step from
`dataplane.parallel.collectives` (base path and LoRA branch separately).

    TP=1 rows use the single-GPU engine's `ModelRunner` (`build_engine` over the random
    base; adapters pinned in its unified pool, the plans' KV blocks drawn from the same
    pool; no dataplane.parallel); TP=2 rows use `TPLlamaForCausalLM` over NCCL and a
    `ModelRunner` of its own, one process per GPU (spawned here), for the layouts
    "no_extra_collectives" (default) and "paper" (seed §0x06F2–F3).

Decode: `--batch` requests of `--context` prompt tokens, prefilled once, then `--steps`
timed decode steps (adapter of request i = i % n, or with `--zipf S` drawn from
Zipf(S) popularity over the n adapters; rows report "distinct_adapters"), run eagerly
and/or replayed from CUDA graphs (`--graphs eager|graphs|both`; TP=1 uses the engine's
`CudaGraphRunner`, TP=2 `dataplane.parallel.tp_graphs.TPCudaGraphRunner`, which captures
each rank's step with its NCCL collectives and counts the captured collectives on every
replay). Only the
`--batch` size is captured (one graph per rank), context width `--context + --steps`.
Prefill: `--prefill-requests` requests of `--prefill-len` tokens in one step. Mixed: the
decode requests' next tokens and `--mixed-prompts` prompts of `--mixed-prompt-len` tokens
in one step (64 + 4 x 128 = 576 rows by default, a typical serving step). Both run
eagerly, and with `--piecewise` also as piecewise CUDA graphs (the engine's
`PiecewiseGraphRunner`; at TP=2 `dataplane.parallel.tp_piecewise.TPPiecewiseGraphRunner`,
collectives inside the pieces), one bucket per row count.
Targets (issue 6): the default layout adds no collective call, and TP=2 decode with
adapters keeps >= 90% of TP=2 no-LoRA throughput (printed as "keep" lines at the end).

    python bench/tp.py --out $OUT --graphs both         # on nvidia-h200-x2 (both GPUs)
    python bench/tp.py --shape tiny --device cpu --tp 1 2 --adapters 0 4 --steps 2 \
        --batch 4 --context 16 --prefill-requests 2 --prefill-len 16 --kv-blocks 64 \
        --out /tmp/tp                                    # smoke (tests/parallel runs it)

`--layouts` limits the TP>1 rows to some layouts; `--profile N` profiles N more decode
steps per row on rank 0 (CUDA): device µs per step by kernel kind, and the top kernels.
`--fold` repeats each TP>1 default-layout adapter case with the LoRA folded into the base
GEMMs and their consumer ops for decode steps (`enable_lora_fold`; rows "fold": true; the
decode row also times copying adapters the fold lacks into it, "fold_fill_ms").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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

from bench.synthetic import LLAMA3_8B, TINY_SHAPE, pool_pages
from bench.tp_profile import BLOCK, profile_decode, sync
from dataplane.core import Sequence, build_batch_plan
from dataplane.engine import BaseModel, Engine, EngineConfig, EngineSpec, build_engine
from dataplane.engine.adapters import LoadedAdapter, ModuleFactors
from dataplane.engine.cuda_graphs import CudaGraphRunner
from dataplane.engine.model_runner import ModelRunner
from dataplane.engine.piecewise_graphs import PiecewiseGraphRunner
from dataplane.kvcache.page_pool import PageKind
from dataplane.models import ModelConfig, init_random
from dataplane.models.llama import LORA_GROUPS, LlamaForCausalLM
from dataplane.parallel import LAYOUT_LOCAL, LAYOUT_PAPER, TPGroup, init_tp_group
from dataplane.parallel.llama_tp import TPLlamaForCausalLM
from dataplane.parallel.tp_graphs import TPCudaGraphRunner
from dataplane.parallel.tp_piecewise import TPPiecewiseGraphRunner

SHAPES: dict[str, dict[str, Any]] = {"8b": LLAMA3_8B, "tiny": TINY_SHAPE}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DIGEST = hashlib.sha256(b"bench-tp-random-base").hexdigest()


def random_adapter(
    config: ModelConfig, rank: int, seed: int, device: torch.device, dtype: torch.dtype
) -> dict[tuple[int, str], Any]:
    """Global factors of one adapter on every projection (PEFT orientation)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    c = config
    shapes = {
        "qkv_proj": (c.hidden_size, (c.q_size, c.kv_size, c.kv_size)),
        "o_proj": (c.q_size, (c.hidden_size,)),
        "gate_up_proj": (c.hidden_size, (c.intermediate_size,) * 2),
        "down_proj": (c.intermediate_size, (c.hidden_size,)),
    }
    out: dict[tuple[int, str], Any] = {}
    for layer in range(c.num_layers):
        for attr in LORA_GROUPS:
            d_in, widths = shapes[attr]
            out[(layer, attr)] = {
                k: (
                    0.01 * torch.randn(rank, d_in, generator=gen, device=device, dtype=dtype),
                    0.01 * torch.randn(w, rank, generator=gen, device=device, dtype=dtype),
                    2.0,
                )
                for k, w in enumerate(widths)
            }
    return out


def as_loaded(factors: dict[tuple[int, str], Any], index: int) -> LoadedAdapter:
    """`random_adapter`'s factors as an engine adapter (per module, its own digest)."""
    modules = tuple(ModuleFactors(layer, LORA_GROUPS[attr][k], a, b, scale)
                    for (layer, attr), slices in factors.items()
                    for k, (a, b, scale) in slices.items())
    return LoadedAdapter(modules, hashlib.sha256(f"bench-tp-{index}".encode()).hexdigest(),
                         f"random:{index}")


def request_adapters(requests: int, n_adapters: int, zipf: float) -> list[int]:
    """Adapter slot of each request: i % n (`zipf` 0), or drawn from Zipf(`zipf`) popularity
    over the n adapters (slot k with weight 1 / (k + 1)^zipf, a fixed seed); -1 without."""
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


def run_phase(
    runner: ModelRunner,
    group: TPGroup | None,
    args: argparse.Namespace,
    n_adapters: int,
    phase: str,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Time one phase; returns step times and per-step collective ledgers (this rank).

    decode: the decode requests, one token each per step; prefill: the prompts, whole, per
    step; mixed: both in one step (the prompts prefilled again every step). With `engine`
    (TP=1: `runner` is its runner) request i's adapter is the engine's i-th loaded one and
    the KV blocks come from the engine's pool; otherwise adapter k is slot k and block b
    is KV block b of the runner's cache."""
    device = runner.device
    dec_n, context, pre_n, pre_len = phase_shape(args, phase)
    steps = args.steps if phase == "decode" else args.prefill_steps
    vocab = min(1003, runner.model.config.vocab_size)
    per_seq_blocks = -(-(max(context, pre_len) + steps + 2) // BLOCK)
    adapter_of = request_adapters(dec_n + pre_n, n_adapters, args.zipf)
    slots = sorted(engine.adapters.bound()) if engine is not None else list(range(n_adapters))
    count = (dec_n + pre_n) * per_seq_blocks
    blocks = (engine.pool.kv_view.allocate(count, PageKind.KV) if engine is not None
              else list(range(count)))

    def make(i: int, prompt_len: int) -> Sequence:
        slot = slots[adapter_of[i]] if adapter_of[i] >= 0 else -1
        prompt = tuple((7 * i + 13 * t) % (vocab - 3) + 3 for t in range(prompt_len))
        seq = Sequence(
            f"r{i}", prompt, adapter_slot=slot, adapter_digest=None if slot < 0 else "0" * 64
        )
        seq.block_table.extend(blocks[i * per_seq_blocks: (i + 1) * per_seq_blocks])
        return seq

    seqs = [make(i, context) for i in range(dec_n)]
    prompts = [make(dec_n + i, pre_len) for i in range(pre_n)]
    times, ledgers = [], []
    per_step = max(1, runner.max_rows // max(context, 1))
    for lo in range(0, dec_n, per_step):  # prefill once, untimed, as many as fit a step
        runner.execute(
            build_batch_plan(
                [(s, s.num_tokens) for s in seqs[lo : lo + per_step]],
                [],
                block_size=BLOCK,
                generation=0,
                check=False,
            )
        )
    for s in seqs:
        s.num_computed_tokens = s.num_tokens
        s.token_ids.append(5)
    for step in range(steps + 1):  # step 0 warms up
        for s in prompts:
            s.num_computed_tokens = 0
        plan = build_batch_plan(
            [(s, s.num_tokens) for s in prompts],
            seqs,
            block_size=BLOCK,
            generation=step + 1,
            check=False,
        )
        if group is not None:
            group.counter.reset()
        sync(device)
        t0 = time.perf_counter()
        runner.execute(plan)
        sync(device)
        if step:
            times.append(time.perf_counter() - t0)
        if group is not None and step:
            c = group.counter
            ledgers.append(
                {
                    p: {
                        "calls": c.calls(p),
                        "payload_bytes": c.payload_bytes(p),
                        "ring_bytes": float(c.ring_bytes(p)),
                    }
                    for p in ("base", "lora")
                }
            )
        for s in seqs:
            s.num_computed_tokens = s.num_tokens
            s.token_ids.append(5)
    kernels = None
    if phase == "decode" and args.profile and device.type == "cuda":  # every rank steps
        kernels = profile_decode(runner, group, seqs, args.profile, steps + 1)
    if engine is not None:
        engine.pool.kv_view.free(blocks, PageKind.KV)
    med = statistics.median(times)
    return {
        "phase": phase,
        "requests": dec_n + pre_n,
        "prompt_len": pre_len or context,
        "rows_per_step": dec_n + pre_n * pre_len,
        "distinct_adapters": len({a for a in adapter_of if a >= 0}),
        "median_step_ms": 1e3 * med,
        "tokens_per_s": (dec_n + pre_n * pre_len) / med,
        "collectives_per_step": ledgers[-1] if ledgers else None,
        **({"kernels": kernels} if kernels is not None else {}),
    }


def time_fold_fill(model: LlamaForCausalLM, device: torch.device) -> dict[str, Any]:
    """Seconds to copy the resident adapters the fold does not hold into it, as many as it
    holds (a step whose every row brings an adapter the fold lacks); every rank runs it."""
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


def capture_graphs(runner: ModelRunner, group: TPGroup | None,
                   args: argparse.Namespace) -> str | None:
    """Capture the decode graph of `--batch` rows (CUDA only); None or the error text.

    Every rank captures the same single (batch, width) graph, so their NCCL collectives
    match during capture and replay."""
    if runner.device.type != "cuda" or not runner.graph_safe:
        return "CUDA graphs need a CUDA device and a graph-safe LoRA backend"
    max_context = args.context + args.steps + 2
    try:
        if group is None:
            graphs: CudaGraphRunner = CudaGraphRunner(
                runner, args.batch, max_context, batch_sizes=(args.batch,)
            )
        else:
            graphs = TPCudaGraphRunner(
                runner, group, args.batch, max_context, batch_sizes=(args.batch,)
            )
        graphs.capture_all()
    except Exception as exc:  # reported in the row, eager rows still stand
        return f"{type(exc).__name__}: {exc}"[:500]
    runner.graphs = graphs
    return None


def capture_pieces(runner: ModelRunner, group: TPGroup | None,
                   args: argparse.Namespace) -> str | None:
    """Capture the piecewise graphs of the prefill and mixed steps' row counts (CUDA only,
    one bucket each, the same on every rank); None or the error text."""
    if runner.device.type != "cuda" or not runner.graph_safe:
        return "CUDA graphs need a CUDA device and a graph-safe LoRA backend"
    buckets = tuple(sorted({phase_rows(args, "prefill"), phase_rows(args, "mixed")}))
    try:
        if group is None:
            pieces: PiecewiseGraphRunner = PiecewiseGraphRunner(
                runner, buckets[-1], buckets=buckets)
        else:
            pieces = TPPiecewiseGraphRunner(runner, group, buckets[-1], buckets=buckets)
        pieces.capture_all()
    except Exception as exc:  # reported in the row, eager rows still stand
        return f"{type(exc).__name__}: {exc}"[:500]
    runner.piecewise = pieces
    return None


def build_global(
    config: ModelConfig, args: argparse.Namespace, device: torch.device
) -> LlamaForCausalLM:
    model = LlamaForCausalLM(config, DTYPES[args.dtype], device)
    return init_random(model, seed=0)


def bench_rank(
    rank: int, tp: int, init_file: str, args: argparse.Namespace, results_dir: str
) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(tp, 1)))
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{rank}")
    config = ModelConfig.from_dict(dict(SHAPES[args.shape]))
    dtype = DTYPES[args.dtype]
    group = (
        init_tp_group(rank, tp, init_method=f"file://{init_file}", device=device)
        if tp > 1
        else None
    )
    global_model = build_global(config, args, device)
    rows = []
    modes = ["eager", "graphs"] if args.graphs == "both" else [args.graphs]
    contents: dict[int, dict[tuple[int, str], Any]] = {}
    max_rows = max(args.batch, args.context, phase_rows(args, "prefill"),
                   phase_rows(args, "mixed"))
    for n in args.adapters:
        layouts = list(args.layouts) if (tp > 1 and n > 0) else [LAYOUT_LOCAL]
        cases = [(layout, fold) for layout in layouts
                 for fold in ((False, True) if args.fold and tp > 1 and n > 0
                              and layout == LAYOUT_LOCAL else (False,))]
        for layout, fold in cases:
            slots = max(n, 1)
            where = torch.device("cpu") if group is None else device
            for k in range(min(n, 16)):  # 16 distinct contents, generated once
                if k not in contents:
                    contents[k] = random_adapter(config, args.rank, k, where, dtype)
            engine: Engine | None = None
            if group is None:  # the engine's runner; adapters pinned in its pool
                model: LlamaForCausalLM = global_model
                loaded = [as_loaded(contents[slot % 16], slot) for slot in range(n)]
                engine = build_engine(EngineSpec(BaseModel(model, DIGEST), EngineConfig(
                    max_num_seqs=args.batch, max_num_batched_tokens=max_rows,
                    num_kv_blocks=pool_pages(model, loaded, args.kv_blocks, BLOCK),
                    block_size=BLOCK, max_slots=n, max_rank=args.rank,
                    enable_cuda_graphs=False, attention_backend=args.attention),
                    lora_fold="off"))
                for adapter in loaded:
                    engine.register_loaded_adapter(adapter)
                runner = engine.runner
            else:
                model = TPLlamaForCausalLM(
                    global_model,
                    group,
                    lora_layouts=dict.fromkeys(LORA_GROUPS, layout),
                    max_slots=slots if n else 0,
                    max_rank=args.rank,
                )
                runner = ModelRunner(
                    model,
                    num_kv_blocks=args.kv_blocks,
                    block_size=BLOCK,
                    max_rows=max_rows,
                    max_slots=slots if n else 0,
                    max_rank=args.rank,
                    attention_backend=args.attention,
                )
                for slot in range(n):  # distinct storage per slot
                    model.load_adapter(slot, contents[slot % 16])
            if fold and isinstance(model, TPLlamaForCausalLM):  # decode steps only
                model.enable_lora_fold(args.batch, args.fold_width_unit)
            runs = [("decode", mode) for mode in modes] + [("prefill", "eager"),
                                                           ("mixed", "eager")]
            if args.piecewise:
                runs += [("prefill", "piecewise"), ("mixed", "piecewise")]
            pieces_error: str | None = None
            for phase, mode in runs:
                extra: dict[str, Any] = {}
                if mode == "graphs":
                    error = capture_graphs(runner, group, args)
                    if error is not None:  # keep the eager rows of this run
                        extra["graphs_error"] = error
                if mode == "piecewise":
                    if runner.piecewise is None and pieces_error is None:
                        pieces_error = capture_pieces(runner, group, args)
                    if pieces_error is not None:
                        extra["graphs_error"] = pieces_error
                row: dict[str, Any] = (
                    {"phase": phase}
                    if "graphs_error" in extra
                    else run_phase(runner, group, args, n, phase, engine)
                )
                replays = getattr(runner.graphs, "replays", None)
                runner.graphs = None
                row.update(
                    {
                        "mode": mode,
                        "tp": tp,
                        "layout": layout if (n and tp > 1) else "-",
                        "fold": fold,
                        "adapters": n,
                        "rank": args.rank,
                        "zipf": args.zipf,
                        "shape": args.shape,
                        "dtype": args.dtype,
                        **extra,
                    }
                )
                if mode == "graphs":
                    row["graph_replays"] = replays
                if phase == "decode" and fold and "graphs_error" not in extra:
                    row.update(time_fold_fill(model, device))
                if mode == "piecewise" and runner.piecewise is not None:
                    row["piecewise_runs"] = runner.piecewise.runs  # type: ignore[attr-defined]
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
                    with (args.out / "tp_rows.jsonl").open("a") as f:  # survives a timeout
                        f.write(json.dumps(row) + "\n")
            if runner.piecewise is not None:  # holds the NCCL communicator at TP > 1
                runner.piecewise.release()  # type: ignore[attr-defined]
                runner.piecewise = None
            del runner, model, engine
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
    mode without LoRA (issue 6 target: decode >= 0.90 for TP=2, default layout)."""
    timed = [r for r in rows if r["phase"] in ("decode", "mixed") and "tokens_per_s" in r]
    base = {(r["tp"], r["phase"], r["mode"]): r["tokens_per_s"]
            for r in timed if r["adapters"] == 0}
    out = []
    for r in timed:
        key = (r["tp"], r["phase"], r["mode"])
        if r["adapters"] and key in base:
            out.append(
                {
                    "keep": round(r["tokens_per_s"] / base[key], 3),
                    "tp": r["tp"],
                    "phase": r["phase"],
                    "mode": r["mode"],
                    "layout": r["layout"],
                    "fold": r.get("fold", False),
                    "adapters": r["adapters"],
                }
            )
    return out


def model_args(p: argparse.ArgumentParser, adapters: list[int]) -> None:
    """--shape, --device, --dtype, --tp and --adapters (TP benchmarks share them)."""
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--adapters", type=int, nargs="+", default=adapters)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_args(p, [0, 16, 128])
    p.add_argument("--rank", type=int, default=16)
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
    p.add_argument("--kv-blocks", type=int, default=4096)
    p.add_argument("--fold", action="store_true",
                   help="TP > 1, default layout: each adapter case again with every slot "
                        "folded into the base GEMMs and their consumer ops for decode steps")
    p.add_argument("--fold-width-unit", type=int, default=None,
                   help="fold widths in multiples of this many slots (default: FoldSlots'; "
                        "--batch: one width, every fold slot read every step)")
    p.add_argument("--attention", choices=("torch", "triton"), default=None)
    p.add_argument(
        "--graphs",
        choices=("eager", "graphs", "both"),
        default="eager",
        help="decode steps eager, replayed from CUDA graphs, or both",
    )
    p.add_argument("--profile", type=int, default=0,
                   help="decode steps to profile after the timed ones (torch.profiler, rank 0)")
    p.add_argument("--layouts", nargs="+", choices=(LAYOUT_LOCAL, LAYOUT_PAPER),
                   default=[LAYOUT_LOCAL, LAYOUT_PAPER], help="LoRA layouts of the TP>1 rows")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    if args.device == "cpu":
        args.attention = "torch"
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for tp in args.tp:
        rows += run_ranks(bench_rank, tp, args)
    (args.out / "tp_bench.json").write_text(json.dumps(rows, indent=1))
    for line in keep_ratios(rows):
        print(json.dumps(line))
    print(json.dumps({"written": str(args.out / "tp_bench.json"), "rows": len(rows)}))


if __name__ == "__main__":
    main()
