"""End-to-end engine benchmark on a synthetic S-LoRA-style trace.

Trace (bench/synthetic.py `make_trace`): `--requests` requests; adapter of each request
drawn from N adapters with Zipf(1.0) popularity (`--popularity uniform`: uniform);
arrivals Poisson at `--rate` req/s (`inf`: all at t=0, offline); prompt lengths uniform in
[--prompt-min, --prompt-max] tokens (random ids); output lengths uniform in
[--output-min, --output-max] (EOS ignored). Greedy.

Systems, measured in the same run on the same trace:
  engine+lora   the engine, every request on its adapter (factors pinned in the engine's
                unified pool beside the KV blocks; `--fold` decides the LoRA fold)
  engine-base   the engine with LoRA disabled (max_slots=0), same prompts, no adapter
  hf+peft       HF transformers + PEFT `generate` with a mixed batch (`adapter_names`),
                static batches of `--hf-batch` requests in arrival order
Both engines schedule under `--policy` (default fcfs: arrival order, so the two arms launch
the same plans and their ratio is the cost of LoRA alone; the fair policy's adapter cost
vector reorders the LoRA arm's requests queued in the same round, which the base arm has
no adapters to do). Each engine is first warmed up, untimed, on the trace's prompts
reversed, 2 tokens each.
Reported (bench/trace_run.py): output tokens/s, TTFT and per-token latency p50/p99, the
launched plans by class. HF `generate` does not stream: a static batch's token times are
spread evenly over its `generate()` call. `--kv-blocks` is the KV capacity of every arm:
the LoRA arm's pool gets its adapters' pages on top (bench/synthetic.py `pool_pages`).

    python bench/trace.py --mode cpu --requests 32 --prompt-min 128 --prompt-max 128 \
        --output-min 64 --output-max 64          # SmolLM2 + 8 adapters (ranks 8/16, q/k/v/o)
    python bench/trace.py --mode cuda --adapters 1 16 128   # Llama-3-8B-shaped random bf16
    python bench/trace.py --mode cuda --shape tiny --device cpu --dtype float32  # smoke
    python bench/trace.py --mode cuda --adapters 128 --rounds 5   # A/B rounds, median ratio
    python bench/trace.py --mode cuda --adapters 128 --rounds 3 --sequential --fold auto  # 80 GB
    python bench/trace.py --mode cuda --adapters 128 --fold on    # decode steps folded
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.synthetic import (
    ALL_LINEAR,
    BLOCK_SIZE,
    SHAPES,
    Request,
    adapters_for,
    make_trace,
    pool_pages,
    random_base,
    rotated,
    save_results,
    sync,
)
from bench.trace_run import Timing, markdown, print_class_gaps, run_engine, summarize
from dataplane.engine import BaseModel, Engine, EngineConfig, EngineSpec, build_engine
from dataplane.engine.builder import FOLD_CHOICES
from dataplane.engine.fairness import POLICIES

HF_MAX_ADAPTERS = 16
"""HF + PEFT holds at most this many adapters (the table's HF row)."""


def run_hf(model: Any, trace: list[Request], adapter_names: list[str], batch: int,
           device: str) -> dict:
    """Static mixed batches in arrival order; left-padded; `adapter_names` per row."""
    timings, n_tokens = [], 0
    start = time.perf_counter()
    for b in range(0, len(trace), batch):
        group = trace[b: b + batch]
        wait = start + max(r.arrival for r in group) - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        width = max(len(r.prompt) for r in group)
        ids = torch.tensor([[0] * (width - len(r.prompt)) + r.prompt for r in group])
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in group])
        names = [adapter_names[r.adapter] if r.adapter is not None and adapter_names
                 else "__base__" for r in group]
        new = max(r.max_tokens for r in group)
        kwargs = {"adapter_names": names} if adapter_names else {}
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0, **kwargs)
        sync(device)
        per = (time.perf_counter() - t0) / new
        for r in group:  # static batch: every row's tokens arrive at the batch's pace
            timings.append(Timing(start + r.arrival,
                                  [t0 + per * (k + 1) for k in range(r.max_tokens)]))
            n_tokens += r.max_tokens
    return summarize("hf+peft", timings, time.perf_counter() - start, n_tokens)


def engine_config(args: argparse.Namespace, slots: int, pages: int, max_len: int | None
                  ) -> EngineConfig:
    """The trace's engine sizes (`slots` = 0: LoRA disabled; `pages`: the unified pool)."""
    return EngineConfig(max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_batched_tokens, num_kv_blocks=pages,
                        block_size=BLOCK_SIZE, max_slots=slots, max_rank=16,
                        max_model_len=max_len, enable_piecewise_graphs=args.piecewise,
                        scheduling_policy=args.policy)


def lora_arm(args: argparse.Namespace, base: BaseModel, adapters: list, max_len: int | None
             ) -> tuple[Engine, list]:
    """The LoRA engine: KV for `--kv-blocks` blocks plus `adapters`' pages, all pinned."""
    pages = pool_pages(base.model, adapters, args.kv_blocks)
    engine = build_engine(EngineSpec(base, engine_config(args, len(adapters), pages, max_len),
                                     lora_fold=args.fold))
    return engine, [engine.register_loaded_adapter(a) for a in adapters]


def base_arm(args: argparse.Namespace, base: BaseModel, max_len: int | None) -> Engine:
    return build_engine(EngineSpec(base, engine_config(args, 0, args.kv_blocks, max_len),
                                   lora_fold="off"))


def described(result: dict, engine: Engine, adapters: int, **extra: Any) -> dict:
    """`result` with the arm's adapters, fold (and the steps it folded so far, warm-ups
    included), the steps async scheduling launched before the previous step's tokens
    reached the host (so far, warm-ups included) and pool pages (all, and the adapters')."""
    counts = engine.pool.pool.pages.counts()
    fold = engine.model.lora_fold_slots
    return {**result, "adapters": adapters, "fold": engine.config.lora_fold,
            "folded_steps": sum(fold.width_steps.values()) if fold is not None else 0,
            "overlapped_steps": engine.num_overlapped_steps,
            "pool_pages": counts.total, "adapter_pages": counts.adapter, **extra}


def cpu_main(args: argparse.Namespace) -> list[dict]:
    """SmolLM2-135M (fp32, CPU) with `--adapters` PEFT adapters of ranks 8/16 on q/k/v/o."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from dataplane.assets import make_peft_adapter, prepare_smollm2
    from dataplane.engine import load_base
    from dataplane.engine.adapters import load_peft_adapter

    work = Path(args.workdir)
    base_dir = prepare_smollm2(work / "smollm2")
    n = args.adapters[0]
    dirs = []
    for i in range(n):
        dest = work / f"adapter-{i}"
        if not (dest / "adapter_model.safetensors").is_file():
            make_peft_adapter(base_dir, dest, seed=100 + i, rank=8 if i % 2 == 0 else 16,
                              alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        dirs.append(dest)
    base = load_base(base_dir, "float32", "cpu")
    assert base.abi is not None
    trace = make_trace(args, base.model.config.vocab_size, n)
    adapters = [load_peft_adapter(d, base.abi, 16) for d in dirs]
    lora, handles = lora_arm(args, base, adapters, None)
    results = [described(run_engine("engine+lora", lora, trace, handles, "cpu"), lora, n)]
    del lora, handles
    plain = base_arm(args, base, None)
    results.append(described(run_engine("engine-base", plain, trace, [], "cpu"), plain, 0))
    del plain
    if not args.skip_hf:
        hf = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
        peft = PeftModel.from_pretrained(hf, dirs[0], adapter_name="a0")
        for i, d in enumerate(dirs[1:], start=1):
            peft.load_adapter(d, adapter_name=f"a{i}")
        trace_hf = trace[: args.hf_requests]
        results.append({**run_hf(peft, trace_hf, [f"a{i}" for i in range(n)], args.hf_batch,
                                 "cpu"), "adapters": n})
    return results


def cuda_main(args: argparse.Namespace) -> list[dict]:
    """Random-weights mode (default: Llama-3-8B shape, bf16, on CUDA)."""
    dev, dtype = args.device, getattr(torch, args.dtype)
    base = random_base(SHAPES[args.shape], dtype, dev)
    config = base.model.config
    max_len = args.prompt_max + args.output_max + 16
    if args.rounds > 1:
        return ab_rounds(args, base, max_len)
    results = []
    for n in args.adapters:
        trace = make_trace(args, config.vocab_size, n)
        engine, handles = lora_arm(args, base, adapters_for(config, n, dtype, "random-adapter"),
                                   max_len)
        results.append(described(run_engine("engine+lora", engine, trace, handles, dev),
                                 engine, n))
        if args.split_eager:
            from bench.trace_split import split_eager

            split_eager(engine, trace, handles, Path(args.out or ".") / f"split_n{n}.txt")
        del engine, handles
        if dev == "cuda":
            torch.cuda.empty_cache()
        if n == args.adapters[0]:
            plain = base_arm(args, base, max_len)
            results.append(described(run_engine("engine-base", plain, trace, [], dev), plain, 0))
            if args.split_eager:
                from bench.trace_split import split_eager

                split_eager(plain, trace, [], Path(args.out or ".") / "split_n0.txt")
            del plain
    if not args.skip_hf:
        del base
        results.append(random_hf(args, config, SHAPES[args.shape], dev, dtype))
    return results


def ab_rounds(args: argparse.Namespace, base: BaseModel, max_len: int) -> list[dict]:
    """``--rounds R``: the LoRA engine (``--adapters``' first N) and the no-LoRA engine
    built side by side (each on its own copy of the model), then R rounds of both on the
    trace, round ``i`` with prompts rotated by ``i`` tokens (no prefix hit on an earlier
    round) and the two arms in alternating order (drift in the GPU's clocks or the host
    hits both alike). Prints each round's ratio and their median; every result row
    carries its round."""
    n, config, dev = args.adapters[0], base.model.config, args.device
    trace = make_trace(args, config.vocab_size, n)
    adapters = adapters_for(config, n, base.model.dtype, "random-adapter")
    if args.sequential:
        rounds = sequential_rounds(args, base, adapters, trace, max_len)
    else:
        lora, handles = lora_arm(args, base, adapters, max_len)
        # A model of its own (same seed, same weights): one model serves one engine.
        twin = random_base(SHAPES[args.shape], base.model.dtype, dev)
        rounds = alternating_rounds(args, {
            "engine+lora": (lora, handles, n),
            "engine-base": (base_arm(args, twin, max_len), [], 0)}, trace)
    results, ratios = [], []
    for i, (got, order) in enumerate(rounds):
        results += [got["engine+lora"], got["engine-base"]]
        ratios.append(got["engine+lora"]["output_tok_s"] / got["engine-base"]["output_tok_s"])
        print(f"# round {i} ({' then '.join(order)}): ratio {ratios[-1]:.3f}",
              file=sys.stderr, flush=True)
        print_class_gaps(got["engine+lora"]["plan_classes"], got["engine-base"]["plan_classes"])
    print(f"# ratio per round {[round(r, 3) for r in ratios]}, median "
          f"{statistics.median(ratios):.3f}", file=sys.stderr, flush=True)
    return results


Round = tuple[dict[str, dict], list[str]]
"""One A/B round: each arm's result, and the order the arms ran in."""


def alternating_rounds(args: argparse.Namespace, arms: dict[str, tuple[Engine, list, int]],
                       trace: list) -> list[Round]:
    """Both engines resident; the arms' order alternates per round."""
    rounds = []
    for i in range(args.rounds):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        got = {}
        for name in order:
            engine, hs, adapters = arms[name]
            got[name] = described(run_engine(name, engine, rotated(trace, i), hs, args.device),
                                  engine, adapters, round=i)
        rounds.append((got, order))
    return rounds


def sequential_rounds(args: argparse.Namespace, base: BaseModel, adapters: list,
                      trace: list, max_len: int) -> list[Round]:
    """``--sequential``: every LoRA round, then the LoRA engine released (its pool and the
    model's factor sources) and every no-LoRA round on the same model, for a card that
    cannot hold both engines (an 80 GB one with the 8B shape, 128 adapters and the fold).
    Round i of each arm sees the same rotated prompts; GPU drift is not cancelled here."""
    n, dev = len(adapters), args.device
    lora, handles = lora_arm(args, base, adapters, max_len)
    runs = [described(run_engine("engine+lora", lora, rotated(trace, i), handles, dev), lora,
                      n, round=i) for i in range(args.rounds)]
    del lora, handles
    for _layer, _attr, linear in base.model.lora_linears():
        linear.attach_factors(None)
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    plain = base_arm(args, base, max_len)
    order = ["engine+lora", "engine-base"]
    return [({"engine+lora": got, "engine-base": described(
        run_engine("engine-base", plain, rotated(trace, i), [], dev), plain, 0, round=i)},
        order) for i, got in enumerate(runs)]


def random_hf(args: argparse.Namespace, config: Any, shape: dict, dev: str,
              dtype: torch.dtype) -> dict:
    """HF + PEFT on a random model of the same shape with rank-16 all-linear adapters."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    n = min(args.adapters[-1], HF_MAX_ADAPTERS)
    hf_cfg = LlamaConfig(**{k: v for k, v in shape.items() if k != "model_type"})
    torch.set_default_dtype(dtype)
    with torch.device(dev):
        hf = HFLlama(hf_cfg).eval()
    torch.set_default_dtype(torch.float32)
    lcfg = LoraConfig(r=16, lora_alpha=32, target_modules=list(ALL_LINEAR),
                      init_lora_weights=False)
    peft = get_peft_model(hf, lcfg, adapter_name="a0")
    for i in range(1, n):
        peft.add_adapter(f"a{i}", lcfg)
    peft.eval()
    trace = make_trace(args, config.vocab_size, n)[: args.hf_requests]
    return {**run_hf(peft, trace, [f"a{i}" for i in range(n)], args.hf_batch, dev),
            "adapters": n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: SmolLM2 + PEFT adapters; cuda: random weights (--shape, "
                        "--device, --dtype)")
    p.add_argument("--adapters", type=int, nargs="+", default=None)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--rate", type=float, default=float("inf"), help="req/s; inf = offline")
    p.add_argument("--popularity", choices=("zipf", "uniform"), default="zipf",
                   help="adapter popularity: Zipf(1.0) or uniform")
    p.add_argument("--prompt-min", type=int, default=128)
    p.add_argument("--prompt-max", type=int, default=128)
    p.add_argument("--output-min", type=int, default=64)
    p.add_argument("--output-max", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-batched-tokens", type=int, default=512)
    p.add_argument("--kv-blocks", type=int, default=512,
                   help="KV blocks of every arm (the LoRA arm's pool adds its adapters' pages)")
    p.add_argument("--fold", nargs="?", choices=FOLD_CHOICES, const="on", default="off",
                   help="the LoRA arm's fold (bare --fold: on; auto: the fold cost model)")
    p.add_argument("--piecewise", action=argparse.BooleanOptionalAction, default=True,
                   help="mixed steps as piecewise CUDA graphs (both engines; the default)")
    p.add_argument("--policy", choices=POLICIES, default="fcfs",
                   help="scheduling policy of both engines")
    p.add_argument("--sequential", action="store_true",
                   help="with --rounds: the LoRA rounds, then the no-LoRA rounds on the same "
                        "model (both engines need not fit at once)")
    p.add_argument("--rounds", type=int, default=1,
                   help="cuda mode: >1 = both engines side by side, R alternating rounds")
    p.add_argument("--split-eager", action="store_true",
                   help="cuda mode on CUDA: host enqueue vs device time of each step, on a "
                        "replay (bench/trace_split.py)")
    p.add_argument("--hf-batch", type=int, default=32)
    p.add_argument("--hf-requests", type=int, default=None,
                   help="HF + PEFT runs only the trace's first N requests (default: all)")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--device", default="cuda", help="random-weights mode device")
    p.add_argument("--dtype", default="bfloat16", help="random-weights mode dtype")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="/tmp/adapterplane-bench-engine",
                   help="cpu mode: SmolLM2 and its PEFT adapters (cached)")
    p.add_argument("--out", default=None, help="directory for trace_results.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.adapters is None:
        args.adapters = [8] if args.mode == "cpu" else [1, 16, 128]
    results = (cpu_main if args.mode == "cpu" else cuda_main)(args)
    print(markdown(results))
    save_results(args.out, "trace_results.json", args, results)


if __name__ == "__main__":
    main()
