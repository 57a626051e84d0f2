"""End-to-end engine benchmark on a synthetic S-LoRA-style trace.

Trace: `--requests` requests; adapter of each request drawn from N adapters with Zipf(1.0)
popularity (p_i ∝ 1/i); arrivals Poisson at `--rate` req/s (`inf`: all at t=0, offline);
prompt lengths uniform in [--prompt-min, --prompt-max] tokens (random ids); output lengths
uniform in [--output-min, --output-max] (EOS ignored). Greedy decoding.

Systems, measured in the same run on the same trace:
  engine+lora   this engine, every request on its adapter
  engine-base   this engine with LoRA disabled (max_slots=0), same prompts, no adapter
  hf+peft       HF transformers + PEFT `generate` with a mixed batch (`adapter_names`),
                static batches of `--hf-batch` requests in arrival order
Each engine is first warmed up, untimed, on the trace's prompts reversed, 2 tokens each.
Reported: output tokens/s (total output tokens / makespan), TTFT p50/p99 (first token −
arrival) and per-token latency p50/p99 ((last − first token) / (n − 1) per request). HF
`generate` does not stream: a static batch's token times are spread evenly over its
`generate()` call, so HF's TTFT includes queueing behind earlier batches and its per-token
latency is the batch's mean step time.

    python bench/engine.py --mode cpu --requests 32 --prompt-min 128 --prompt-max 128 \
        --output-min 64 --output-max 64          # SmolLM2 + 8 adapters (ranks 8/16, q/k/v/o)
    python bench/engine.py --mode cuda --adapters 1 16 128   # Llama-3-8B-shaped random bf16
    python bench/engine.py --mode cuda --shape tiny --device cpu --dtype float32  # smoke
    python bench/engine.py --mode cuda --adapters 128 --rounds 5   # A/B rounds, median ratio
    python bench/engine.py --mode decode-step --max-num-seqs 64 --prompt-max 512 \
        --adapters 16 128 --kv-blocks 4096   # one decode step vs the HBM floor
    python bench/engine.py --mode decode-step ... --scheduling sync async  # both loops
    python bench/engine.py --mode host-step --max-num-seqs 64 --prompt-max 512 \
        --kv-blocks 4096 --adapters 128      # host (Python) ms of a graph-path step, CPU
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import io
import json
import math
import os
import pstats
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.batch_plan import BatchPlan
from dataplane.core import SamplingParams
from dataplane.engine.adapters import LoadedAdapter, ModuleFactors
from dataplane.engine.engine import Engine, EngineConfig
from dataplane.models import LlamaForCausalLM, ModelConfig, init_random

LLAMA3_8B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
TINY_SHAPE = {
    **LLAMA3_8B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""`--shape tiny`: the same code path at toy size (smoke test of the random-weights mode)."""
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Request:
    arrival: float
    prompt: list[int]
    max_tokens: int
    adapter: int | None


@dataclass
class Timing:
    arrival: float
    tokens: list[float] = field(default_factory=list)


def make_trace(args: argparse.Namespace, vocab: int, n_adapters: int) -> list[Request]:
    gen = torch.Generator().manual_seed(args.seed)
    # Adapters drawn from their own stream: every N gets the same arrivals and prompts.
    pick = torch.Generator().manual_seed(args.seed + 1)
    weights = torch.tensor([1.0 / (i + 1) for i in range(max(n_adapters, 1))])
    t, out = 0.0, []
    for _ in range(args.requests):
        if math.isfinite(args.rate):
            t += float(torch.empty(1).exponential_(args.rate, generator=gen))
        plen = int(torch.randint(args.prompt_min, args.prompt_max + 1, (1,), generator=gen))
        olen = int(torch.randint(args.output_min, args.output_max + 1, (1,), generator=gen))
        prompt = torch.randint(3, vocab, (plen,), generator=gen).tolist()
        adapter = int(torch.multinomial(weights, 1, generator=pick)) if n_adapters else None
        out.append(Request(t, prompt, olen, adapter))
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summarize(name: str, timings: list[Timing], makespan: float, n_tokens: int) -> dict:
    ttft = [t.tokens[0] - t.arrival for t in timings]
    tpot = [
        (t.tokens[-1] - t.tokens[0]) / (len(t.tokens) - 1) for t in timings if len(t.tokens) > 1
    ]
    return {
        "system": name,
        "output_tok_s": n_tokens / makespan,
        "makespan_s": makespan,
        "output_tokens": n_tokens,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "tpot_p50_ms": 1e3 * percentile(tpot, 50),
        "tpot_p99_ms": 1e3 * percentile(tpot, 99),
    }


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def compiled_kernels() -> set[tuple[str, str]]:
    """(kernel, cache key) of every compiled Triton variant of a `dataplane` kernel so far
    (all devices); a difference of two calls names what compiled in between."""
    import triton

    seen: set[int] = set()
    found: set[tuple[str, str]] = set()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("dataplane.") or mod is None:
            continue
        for obj in vars(mod).values():
            if isinstance(obj, triton.runtime.jit.JITFunction) and id(obj) not in seen:
                seen.add(id(obj))
                for cache in obj.device_caches.values():
                    found.update((f"{name}.{obj.__name__}", str(key)) for key in cache[0])
    return found


def warm_up(engine: Engine, trace: list[Request], handles: list, device: str) -> None:
    """Untimed: every request of the trace with its prompt reversed (same lengths and
    adapters, no prefix-cache hit for the timed run) and 2 output tokens, all at once, so
    the kernel variants this trace's steps launch (prefill lengths, chunked and mixed
    steps) are compiled before the clock starts. (Triton compiles on first use; the
    engine itself pre-compiles its LoRA kernels at construction.)"""
    for i, r in enumerate(trace):
        handle = handles[r.adapter] if r.adapter is not None and handles else None
        engine.add_request(f"warm-up-{i}", r.prompt[::-1],
                           SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), handle)
    while engine.has_unfinished():
        engine.step()
    sync(device)


def run_engine(name: str, engine: Engine, trace: list[Request], handles: list, device: str) -> dict:
    """Online driver: requests join at their arrival time; one engine.step() per loop.
    The engine is warmed up first (`warm_up`, untimed)."""
    warm_up(engine, trace, handles, device)
    compiled = compiled_kernels()
    marks: list[PlanMark] = []  # each launched plan's shape and where its work starts
    launched = engine.on_plan_launched

    def observe(plan: BatchPlan) -> object:
        marks.append(PlanMark.at(plan, device))
        return launched(plan)

    setattr(engine, "on_plan_launched", observe)  # noqa: B010 (bench-only observer)
    steps: list[tuple[float, bool]] = []  # (wall interval, whether a prefill was launched)
    timings: dict[str, Timing] = {}
    generated: dict[str, list[int]] = {}
    pending = list(enumerate(trace))
    n_tokens = 0
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0][1].arrival <= now:
            i, r = pending.pop(0)
            rid = f"{name}-{i}"
            timings[rid] = Timing(start + r.arrival)
            engine.add_request(
                rid,
                r.prompt,
                SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True),
                handles[r.adapter] if r.adapter is not None and handles else None,
            )
        if not engine.has_unfinished():
            time.sleep(max(0.0, pending[0][1].arrival - now))
            continue
        mark, before = len(marks), time.perf_counter()
        outs = engine.step()  # returns once its tokens are on the host; a device sync
        stamp = time.perf_counter()  # here would stall an async engine's next step
        steps.append((stamp - before, any(m.doff > 0 for m in marks[mark:])))
        for o in outs:
            timings[o.request_id].tokens.append(stamp)
            generated.setdefault(o.request_id, []).extend(o.new_token_ids)
            n_tokens += len(o.new_token_ids)
    sync(device)
    end = PlanMark.at(None, device)
    result = summarize(name, list(timings.values()), time.perf_counter() - start, n_tokens)
    result["plan_classes"] = plan_classes(marks, end)
    setattr(engine, "on_plan_launched", launched)  # noqa: B010
    # Greedy: the same engine on the same trace gives the same tokens, run after run.
    in_order = [generated.get(f"{name}-{i}", []) for i in range(len(trace))]
    result["tokens_sha256"] = hashlib.sha256(json.dumps(in_order).encode()).hexdigest()
    new = sorted(compiled_kernels() - compiled)
    result["jit_compiles_timed"] = len(new)
    result["jit_compiled_while_timed"] = [f"{k}: {key[:300]}" for k, key in new]
    result["steps"] = step_breakdown(steps, marks)
    print(f"# {name}: {result['output_tok_s']:.1f} tok/s, {len(new)} Triton compiles while "
          f"timed {[k for k, _ in new]}; steps {result['steps']}", file=sys.stderr, flush=True)
    return result


@dataclass
class PlanMark:
    """A launched plan's shape and a clock reading taken in stream order just before its
    forward is enqueued (a CUDA event on CUDA, the host clock on CPU): plan k's span is
    mark k+1 - mark k, device idle time before the next plan included."""

    doff: int
    decodes: int
    slots: int  # distinct adapter slots among the plan's rows
    event: Any

    @staticmethod
    def at(plan: BatchPlan | None, device: str) -> PlanMark:
        if device == "cuda":
            event: Any = torch.cuda.Event(enable_timing=True)
            event.record()
        else:
            event = time.perf_counter()
        if plan is None:
            return PlanMark(0, 0, 0, event)
        slots = len({s for s in plan.row_slot if s >= 0})
        return PlanMark(plan.doff, plan.num_decodes, slots, event)

    def seconds_until(self, later: PlanMark) -> float:
        if isinstance(self.event, float):
            return float(later.event - self.event)
        return float(self.event.elapsed_time(later.event)) / 1e3


def plan_class(mark: PlanMark) -> str:
    """``decode`` for decode-only plans, else ``mixed<=T`` by the plan's row count on the
    LoRA kernels' T classes (1,024-2,048 split out: the 4,096 class's lower half)."""
    if mark.doff == 0:
        return "decode"
    rows = mark.doff + mark.decodes
    edge = next((e for e in (256, 1024, 2048, 4096) if rows <= e), None)
    return "mixed>4096" if edge is None else f"mixed<={edge}"


def plan_classes(marks: list[PlanMark], end: PlanMark) -> dict[str, dict[str, float]]:
    """Per plan class: plans, seconds (each plan's span in stream order, see `PlanMark`),
    mean rows and mean distinct adapter slots. Two arms run on the same trace schedule the
    same plans, so their classes compare one to one."""
    out: dict[str, dict[str, float]] = {}
    for mark, nxt in zip(marks, [*marks[1:], end], strict=True):
        c = out.setdefault(plan_class(mark), {"plans": 0, "s": 0.0, "rows": 0.0, "slots": 0.0})
        c["plans"] += 1
        c["s"] += mark.seconds_until(nxt)
        c["rows"] += mark.doff + mark.decodes
        c["slots"] += mark.slots
    for c in out.values():
        c["rows"] /= c["plans"]
        c["slots"] /= c["plans"]
    return dict(sorted(out.items()))


def step_breakdown(steps: list[tuple[float, bool]], marks: list[PlanMark]) -> dict:
    """Wall time of the timed run split by step kind: `engine.step()` calls that launched
    a plan with prefill rows ("mixed") and those that launched only decode rows."""
    out: dict[str, float] = {}
    for kind, want in (("mixed", True), ("decode", False)):
        times = [t for t, has_prefill in steps if has_prefill == want]
        out[f"{kind}_steps"] = len(times)
        out[f"{kind}_s"] = sum(times)
        out[f"{kind}_p50_ms"] = 1e3 * percentile(times, 50) if times else float("nan")
    out["prefill_tokens"] = sum(m.doff for m in marks)
    out["decode_rows_mean"] = sum(m.decodes for m in marks) / max(1, len(marks))
    return out


def run_hf(
    model: object, trace: list[Request], adapter_names: list[str], batch: int, device: str
) -> dict:
    """Static mixed batches in arrival order; left-padded; `adapter_names` per row."""
    timings, n_tokens = [], 0
    start = time.perf_counter()
    for b in range(0, len(trace), batch):
        group = trace[b : b + batch]
        wait = start + max(r.arrival for r in group) - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        width = max(len(r.prompt) for r in group)
        ids = torch.tensor([[0] * (width - len(r.prompt)) + r.prompt for r in group])
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in group])
        names = [
            adapter_names[r.adapter] if r.adapter is not None and adapter_names else "__base__"
            for r in group
        ]
        new = max(r.max_tokens for r in group)
        t0 = time.perf_counter()
        kwargs = {"adapter_names": names} if adapter_names else {}
        with torch.no_grad():
            model.generate(  # type: ignore[attr-defined]
                ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                **kwargs,
            )
        sync(device)
        t1 = time.perf_counter()
        for r in group:  # static batch: every row's tokens arrive at the batch's pace
            per = (t1 - t0) / new
            timings.append(
                Timing(start + r.arrival, [t0 + per * (k + 1) for k in range(r.max_tokens)])
            )
            n_tokens += r.max_tokens
    return summarize("hf+peft", timings, time.perf_counter() - start, n_tokens)


def cpu_main(args: argparse.Namespace) -> list[dict]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from dataplane.assets import make_peft_adapter, prepare_smollm2

    work = Path(args.workdir)
    base = prepare_smollm2(work / "smollm2")
    n = args.adapters[0]
    dirs = []
    for i in range(n):
        dest = work / f"adapter-{i}"
        if not (dest / "adapter_model.safetensors").is_file():
            make_peft_adapter(
                base,
                dest,
                seed=100 + i,
                rank=8 if i % 2 == 0 else 16,
                alpha=16,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            )
        dirs.append(dest)
    trace = make_trace(args, 49152, n)
    sizes = dict(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        num_kv_blocks=args.kv_blocks,
        block_size=16,
        max_rank=16,
    )
    results = []
    lora = Engine.from_model_dir(base, dtype="float32", device="cpu", max_slots=n, **sizes)
    handles = [lora.register_adapter(d) for d in dirs]
    results.append(run_engine("engine+lora", lora, trace, handles, "cpu"))
    del lora
    plain = Engine.from_model_dir(base, dtype="float32", device="cpu", max_slots=0, **sizes)
    results.append(run_engine("engine-base", plain, trace, [], "cpu"))
    del plain
    if not args.skip_hf:
        hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
        peft = PeftModel.from_pretrained(hf, dirs[0], adapter_name="a0")
        for i, d in enumerate(dirs[1:], start=1):
            peft.load_adapter(d, adapter_name=f"a{i}")
        results.append(run_hf(peft, trace, [f"a{i}" for i in range(n)], args.hf_batch, "cpu"))
    return results


def random_adapter(
    config: ModelConfig, rank: int, seed: int, device: str, dtype: torch.dtype
) -> LoadedAdapter:
    gen = torch.Generator(device=device).manual_seed(seed)
    modules = []
    for layer in range(config.num_layers):
        for name in ALL_LINEAR:
            d_out, d_in = config.module_shapes[name]
            a = torch.randn(rank, d_in, generator=gen, device=device) / math.sqrt(d_in)
            b = torch.randn(d_out, rank, generator=gen, device=device) * 0.01
            modules.append(ModuleFactors(layer, name, a.to(dtype), b.to(dtype), 2.0))
    digest = hashlib.sha256(f"random-adapter-{seed}-{rank}".encode()).hexdigest()
    return LoadedAdapter(tuple(modules), digest, f"random:{seed}")


def adapters_for(config: ModelConfig, n: int, dtype: torch.dtype, tag: str
                 ) -> list[LoadedAdapter]:
    """`n` rank-16 adapters made on the host: 16 distinct random contents (seeds 0..15, as
    `random_adapter`), each adapter under its own digest (`tag`, index)."""
    contents = [random_adapter(config, 16, i, "cpu", dtype) for i in range(min(n, 16))]
    return [LoadedAdapter(contents[i % 16].modules,
                          hashlib.sha256(f"{tag}-{i}".encode()).hexdigest(), f"random:{i}")
            for i in range(n)]


def pool_engine(model: LlamaForCausalLM, cfg: EngineConfig, digest: str, host_gib: int
                ) -> tuple[Engine, Any]:
    """The agent's default residency (agent/engine_factory.py): KV blocks and LoRA factors
    in one unified page pool of `cfg.num_kv_blocks` pages, `cfg.lora_fold` filling the
    fold from the pages, graphs captured after the projections point at the pool. Returns
    the engine and its `PoolSlots` (load adapters with `slots.load(key, adapter)`)."""
    from agent.pool_slots import PoolSlots

    slots = PoolSlots.for_model(model, num_pages=cfg.num_kv_blocks, block_size=cfg.block_size,
                                max_slots=max(cfg.max_slots, 1), max_rank=cfg.max_rank,
                                host_bytes=host_gib << 30)
    own = replace(cfg, lora_fold=False, enable_cuda_graphs=False, external_factors=True)
    engine = Engine(model, own, digest, kv_pages=slots.kv_view, kv_cache=slots.kv_cache)
    slots.attach(engine)
    if cfg.lora_fold and cfg.max_slots:
        slots.enable_fold()
    if cfg.enable_cuda_graphs:
        engine.capture_cuda_graphs()
    return engine, slots


def trace_config(args: argparse.Namespace, slots: int, max_len: int) -> EngineConfig:
    """The random-weights trace's engine sizes (``slots`` = 0: LoRA disabled)."""
    return EngineConfig(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
        num_kv_blocks=args.kv_blocks, block_size=16, max_slots=slots, max_rank=16,
        max_model_len=max_len, enable_piecewise_graphs=args.piecewise,
        lora_fold=bool(args.fold and slots),
    )


def cuda_main(args: argparse.Namespace) -> list[dict]:
    """Random-weights mode (default: Llama-3-8B shape, bf16, on CUDA)."""
    dev, dtype = args.device, getattr(torch, args.dtype)
    shape = LLAMA3_8B if args.shape == "llama3-8b" else TINY_SHAPE
    config = ModelConfig.from_dict(shape)
    model = init_random(LlamaForCausalLM(config, dtype, torch.device(dev)), seed=0)
    digest = hashlib.sha256(b"random-llama3-8b-shape-seed0").hexdigest()
    max_len = args.prompt_max + args.output_max + 16
    results = []
    if args.rounds > 1:
        return ab_rounds(args, model, config, digest, max_len)
    for n in [] if args.only_hf else args.adapters:
        trace = make_trace(args, config.vocab_size, n)
        pool = None
        if args.pool:  # 16 distinct contents made on the host, one digest per adapter
            engine, pool = pool_engine(model, trace_config(args, n, max_len), digest,
                                       args.pool_host_gib)
            handles = [pool.load(a.digest, a)
                       for a in adapters_for(config, n, dtype, "random-adapter")]
        else:
            engine = Engine(model, trace_config(args, n, max_len), digest)
            handles = [
                engine.register_loaded_adapter(random_adapter(config, 16, i, dev, dtype))
                for i in range(n)
            ]
        res = run_engine("engine+lora", engine, trace, handles, dev)
        results.append({**res, "adapters": n, "pool": args.pool, "fold": args.fold})
        if args.profile:
            profile_trace(engine, trace, handles, dev, Path(args.out or ".") / f"trace_n{n}.txt")
        if args.split_eager:
            split_eager(engine, trace, handles, Path(args.out or ".") / f"split_n{n}.txt",
                        args.host_profile)
        del engine, handles, pool
        if dev == "cuda":
            torch.cuda.empty_cache()
        if n == args.adapters[0]:
            base = Engine(model, trace_config(args, 0, max_len), digest)
            res = run_engine("engine-base", base, trace, [], dev)
            results.append({**res, "adapters": 0})
            if args.profile:
                profile_trace(base, trace, [], dev, Path(args.out or ".") / "trace_n0.txt")
            if args.split_eager:
                split_eager(base, trace, [], Path(args.out or ".") / "split_n0.txt",
                            args.host_profile)
            del base
    if not args.skip_hf:
        del model
        results.append(random_hf(args, config, shape, dev, dtype))
    return results


def rotated(trace: list[Request], by: int) -> list[Request]:
    """The trace with every prompt rotated left by ``by`` tokens: same lengths, adapters and
    arrivals, and (for ``by`` > 0) no full block in common with the unrotated prompts."""
    return [replace(r, prompt=r.prompt[by:] + r.prompt[:by]) for r in trace]


def ab_rounds(args: argparse.Namespace, model: LlamaForCausalLM, config: ModelConfig,
              digest: str, max_len: int) -> list[dict]:
    """``--rounds R``: the LoRA engine (``--adapters``' first N) and the no-LoRA engine
    built side by side (each on its own copy of the model), then R rounds of both on the
    trace, round ``i`` with prompts rotated by ``i`` tokens (no prefix hit on an earlier
    round) and the two arms in alternating order (drift in the GPU's clocks or the host
    hits both alike).
    Prints each round's ratio and their median; every result row carries its round."""
    n = args.adapters[0]
    trace = make_trace(args, config.vocab_size, n)
    cfg = trace_config(args, n, max_len)
    dev, dtype = args.device, getattr(torch, args.dtype)
    lora = Engine(model, cfg, digest)
    handles = [lora.register_loaded_adapter(random_adapter(config, 16, i, dev, dtype))
               for i in range(n)]
    # A model of its own (same seed, same weights): an engine attaches its LoRA tables to
    # the model's projections and a later engine on the same model detaches them.
    twin = init_random(LlamaForCausalLM(config, dtype, torch.device(dev)), seed=0)
    base = Engine(twin, trace_config(args, 0, max_len), digest)
    arms = {"engine+lora": (lora, handles, n), "engine-base": (base, [], 0)}
    results, ratios = [], []
    for i in range(args.rounds):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        got = {}
        for name in order:
            engine, hs, adapters = arms[name]
            got[name] = {**run_engine(name, engine, rotated(trace, i), hs, dev),
                         "adapters": adapters, "round": i}
        results += [got[name] for name in arms]
        ratios.append(got["engine+lora"]["output_tok_s"] / got["engine-base"]["output_tok_s"])
        print(f"# round {i} ({' then '.join(order)}): ratio {ratios[-1]:.3f}",
              file=sys.stderr, flush=True)
        print_class_gaps(got["engine+lora"]["plan_classes"], got["engine-base"]["plan_classes"])
    print(f"# ratio per round {[round(r, 3) for r in ratios]}, median "
          f"{statistics.median(ratios):.3f}", file=sys.stderr, flush=True)
    return results


def print_class_gaps(lora: dict[str, dict[str, float]], base: dict[str, dict[str, float]]) -> None:
    """Per plan class: the LoRA arm's seconds against the no-LoRA arm's, and the gap."""
    for name, c in lora.items():
        b = base.get(name, {"plans": 0, "s": 0.0})
        print(f"#   {name:>12}: {int(c['plans']):4d} plans ({int(b['plans'])}), rows "
              f"{c['rows']:7.1f}, slots {c['slots']:5.1f}: LoRA {c['s']:.3f} s vs "
              f"{b['s']:.3f} s, +{c['s'] - b['s']:.3f} s "
              f"(+{1e3 * (c['s'] - b['s']) / max(1, c['plans']):.2f} ms/plan)",
              file=sys.stderr, flush=True)


def random_hf(
    args: argparse.Namespace, config: ModelConfig, shape: dict, dev: str, dtype: torch.dtype
) -> dict:
    """HF + PEFT on a random model of the same shape with rank-16 all-linear adapters."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    n = min(args.adapters[-1], args.hf_max_adapters)
    hf_cfg = LlamaConfig(**{k: v for k, v in shape.items() if k != "model_type"})
    torch.set_default_dtype(dtype)
    with torch.device(dev):
        hf = HFLlama(hf_cfg).eval()
    torch.set_default_dtype(torch.float32)
    lcfg = LoraConfig(r=16, lora_alpha=32, target_modules=list(ALL_LINEAR), init_lora_weights=False)
    peft = get_peft_model(hf, lcfg, adapter_name="a0")
    for i in range(1, n):
        peft.add_adapter(f"a{i}", lcfg)
    peft.eval()
    trace = make_trace(args, config.vocab_size, n)[: args.hf_requests]
    return {**run_hf(peft, trace, [f"a{i}" for i in range(n)], args.hf_batch, dev), "adapters": n}


def start_decoding(engine: Engine, args: argparse.Namespace, vocab: int, batch: int, ctx: int,
                   handles: list) -> None:
    """`batch` requests of `ctx` random prompt tokens (request i on adapter i % N), stepped
    until every one is past its prefill."""
    gen = torch.Generator().manual_seed(args.seed)
    for i in range(batch):
        engine.add_request(f"d{i}", torch.randint(3, vocab, (ctx,), generator=gen).tolist(),
                           SamplingParams(temperature=0.0, max_tokens=args.steps + 16,
                                          ignore_eos=True),
                           handles[i % len(handles)] if handles else None)
    while engine.scheduler.waiting or any(s.in_prefill for s in engine.scheduler.running):
        engine.step()


def step_intervals(engine: Engine, steps: int, device: str, warm_up: int = 3) -> list[float]:
    """Seconds between consecutive `engine.step()` returns over `steps` steps, after
    `warm_up` untimed ones and a device sync (an async engine keeps a step in flight)."""
    for _ in range(warm_up):
        engine.step()
    times = []
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    return times


def decode_step_main(args: argparse.Namespace) -> list[dict]:
    """Median wall time of one decode step (engine.step(), host work included) with
    `--max-num-seqs` requests all decoding at context ≈ `--prompt-max`, against the HBM
    floor: (weights except the embedding table + every request's KV + the step's distinct
    adapters' factors, each read once) / `--bandwidth` GB/s.

    A step's time is the interval between consecutive `engine.step()` returns (each
    returns after its step's tokens reached the host; no extra device sync between steps,
    so async scheduling keeps its next step in flight as in serving). `--scheduling` runs
    each case with the synchronous loop, the async one, or the engine default (auto)."""
    dev, dtype = args.device, getattr(torch, args.dtype)
    shape = LLAMA3_8B if args.shape == "llama3-8b" else TINY_SHAPE
    config = ModelConfig.from_dict(shape)
    model = init_random(LlamaForCausalLM(config, dtype, torch.device(dev)), seed=0)
    digest = hashlib.sha256(b"random-llama3-8b-shape-seed0").hexdigest()
    batch, ctx = args.max_num_seqs, args.prompt_max
    elem = torch.finfo(dtype).bits // 8
    weights = sum(p.numel() for p in model.parameters()) * elem
    if not config.tie_word_embeddings:
        weights -= model.embed_tokens.weight.numel() * elem
    kv = batch * (ctx + args.steps // 2) * config.num_layers * 2 * config.kv_size * elem
    per_adapter = 16 * sum(i + o for o, i in config.module_shapes.values()) * config.num_layers
    results = []
    cases = [(n, mode) for n in [0, *args.adapters] for mode in args.scheduling]
    for n, mode in cases:
        cfg = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(batch, 2048),
                           num_kv_blocks=args.kv_blocks, block_size=16, max_slots=n,
                           max_rank=16, max_model_len=ctx + args.steps + 32,
                           enable_cuda_graphs=not args.no_graphs,
                           async_scheduling={"sync": False, "async": True}.get(mode))
        engine = Engine(model, cfg, digest)
        scheduling = "async" if engine.async_scheduling else "sync"
        handles = [engine.register_loaded_adapter(random_adapter(config, 16, i, dev, dtype))
                   for i in range(n)]
        start_decoding(engine, args, config.vocab_size, batch, ctx, handles)
        times = step_intervals(engine, args.steps, dev)
        if args.profile:
            profile_steps(engine, dev,
                          Path(args.out or ".") / f"profile_n{n}_{scheduling}.txt")
        floor = (weights + kv + min(n, batch) * per_adapter * elem) / (args.bandwidth * 1e9)
        step = percentile(times, 50)
        results.append({"system": f"decode step B={batch} ctx~{ctx} ({scheduling})",
                        "adapters": n, "scheduling": scheduling, "step_ms": 1e3 * step,
                        "mean_step_ms": 1e3 * sum(times) / len(times),
                        "floor_ms": 1e3 * floor, "ratio": step / floor,
                        "overlapped_steps": engine.num_overlapped_steps})
        print(f"# decode step n={n} {scheduling}: {1e3 * step:.2f} ms "
              f"(floor {1e3 * floor:.2f} ms)", file=sys.stderr, flush=True)
        sync(dev)  # an async engine still has its next step in flight
        del engine, handles
        if dev == "cuda":
            torch.cuda.empty_cache()
    return results


def host_step_main(args: argparse.Namespace) -> list[dict]:
    """Host time of one CUDA-graph decode step without the device: the tiny shape on CPU,
    `--max-num-seqs` requests decoding at context ~`--prompt-max`; per step: schedule ->
    plan -> runner.check_plan -> CudaGraphRunner._fill (input staging) -> greedy sample on
    stand-in logits [B, 16] -> postprocess -> request outputs. Median ms over `--steps`."""
    from dataplane.engine.cuda_graphs import CudaGraphRunner

    config = ModelConfig.from_dict(TINY_SHAPE)
    model = init_random(LlamaForCausalLM(config, torch.float32, torch.device("cpu")), seed=0)
    batch, ctx = args.max_num_seqs, args.prompt_max
    results = []
    for n in [0, *args.adapters]:
        cfg = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(batch, 8192),
                           num_kv_blocks=args.kv_blocks, block_size=16, max_slots=n,
                           max_rank=16, max_model_len=ctx + args.steps + 32)
        engine = Engine(model, cfg, hashlib.sha256(b"tiny").hexdigest())
        handles = [engine.register_loaded_adapter(random_adapter(config, 16, i, "cpu",
                                                                 torch.float32))
                   for i in range(n)]
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


def profile_steps(engine: Engine, dev: str, path: Path) -> None:
    """Kernel-level breakdown of 3 decode steps (torch.profiler) written to `path`."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            engine.step()
        sync(dev)
    key = "cuda_time_total" if dev == "cuda" else "cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=90))
    print(f"# profile written to {path}", file=sys.stderr, flush=True)


def profile_trace(engine: Engine, trace: list[Request], handles: list, dev: str,
                  path: Path) -> None:
    """Kernel-level breakdown (torch.profiler) of two windows on an already warm engine,
    written to `path`, each with its wall time against its summed kernel time (host-bound
    if far less): the trace served again (`replay`, rotated by one token); then the same
    prompts rotated by two with one output token each (prefill steps only: eager steps
    without decode rows)."""
    texts = []
    for label, rotate, prefill_only in (("trace", 1, False), ("prefill only", 2, True)):
        texts.append(_profile_window(engine, trace, handles, dev, label, rotate, prefill_only))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(texts))
    print(f"# profile written to {path}", file=sys.stderr, flush=True)


def _profile_window(engine: Engine, trace: list[Request], handles: list, dev: str,
                    label: str, rotate: int, prefill_only: bool) -> str:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    sync(dev)
    with profile(activities=acts) as prof:
        start = time.perf_counter()
        steps = replay(engine, trace, handles, f"profile-{rotate}", rotate, prefill_only)
        sync(dev)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    kernels = sum(getattr(e, "self_device_time_total", 0.0) for e in events) / 1e6
    key = "cuda_time_total" if dev == "cuda" else "cpu_time_total"
    head = f"{label}: {steps} steps, window wall {wall:.3f} s, kernels {kernels:.3f} s"
    print(f"# {head}", file=sys.stderr, flush=True)
    return head + "\n" + events.table(sort_by=key, row_limit=45, max_name_column_width=70)


def replay(engine: Engine, trace: list[Request], handles: list, tag: str, rotate: int,
           prefill_only: bool = False) -> int:
    """Serve the whole trace again on a warm engine, every request at once (the timed
    run's `--rate inf` composition), each prompt rotated by `rotate` tokens (no prefix hit
    on earlier runs' blocks); `prefill_only`: one output token each. Returns the steps."""
    for i, r in enumerate(trace):
        handle = handles[r.adapter] if r.adapter is not None and handles else None
        engine.add_request(f"{tag}-{i}", r.prompt[rotate:] + r.prompt[:rotate],
                           SamplingParams(temperature=0.0, ignore_eos=True,
                                          max_tokens=1 if prefill_only else r.max_tokens),
                           handle)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps


def split_eager(engine: Engine, trace: list[Request], handles: list, path: Path,
                host_profile: bool = False) -> None:
    """Host enqueue time against device time of each step's `runner.execute` (CUDA), on a
    replay of the trace (`replay`): before each call the stream is held by a ~0.15 s device
    spin, so the host queues the whole step while the device waits, and the events around
    the call time its kernels back to back. A step is host-bound when its host time exceeds
    its device time. Also the rest of each `engine.step()` outside `execute` (scheduling,
    plan, sampling, outputs: host work plus the sampled tokens' copy). Steps with prefill
    rows or an eager forward ("eager": mixed steps, also when replayed as piecewise graphs)
    are summed per row class, decode graph replays apart."""
    runner = engine.runner
    forward, execute, step = runner.model.forward, runner.execute, engine.step
    profiles: dict[str, list[cProfile.Profile]] = {"eager": [], "stalled": []}
    collections: list[tuple[int, float]] = []  # (generation, seconds) of each gc pass
    gc_start = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            collections.append((info["generation"], time.perf_counter() - gc_start[0]))
    # (eager, plan rows, execute host s, device s, step s outside execute)
    rows: list[list[Any]] = []
    eager = [False]

    def flagged(*a: Any, **k: Any) -> Any:
        eager[0] = True
        return forward(*a, **k)

    def timed(plan: BatchPlan, *a: Any, **k: Any) -> torch.Tensor:
        eager[0] = False
        torch.cuda._sleep(300_000_000)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        t0 = time.perf_counter()
        out = execute(plan, *a, **k)
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        rows.append([eager[0] or plan.doff > 0, plan.num_rows, host,
                     begin.elapsed_time(end) / 1e3,
                     -(time.perf_counter() - t0)])
        return out

    def stepped() -> Any:
        mark, t0 = len(rows), time.perf_counter()
        prof = cProfile.Profile() if host_profile else None
        if prof is not None:
            prof.enable()
        out = step()
        if prof is not None:
            prof.disable()
        for r in rows[mark:]:
            r[4] += time.perf_counter() - t0
            if prof is not None and r[4] > 0.1:  # a stall outside execute
                profiles["stalled"].append(prof)
            elif prof is not None and r[0]:
                profiles["eager"].append(prof)
        return out

    setattr(runner.model, "forward", flagged)  # noqa: B010 (bench-only instrumentation)
    setattr(runner, "execute", timed)  # noqa: B010
    setattr(engine, "step", stepped)  # noqa: B010
    gc.callbacks.append(on_gc)
    try:
        replay(engine, trace, handles, "split", 3)
    finally:
        del runner.model.forward, runner.execute, engine.step
        gc.callbacks.remove(on_gc)
    lines = []
    classes = [("graph", 0, 1 << 30, False)] + [
        (f"eager T<={hi}", lo, hi, True) for lo, hi in ((0, 256), (256, 1024), (1024, 1 << 30))]
    for label, lo, hi, kind in classes:
        sel = [r for r in rows if r[0] == kind and lo < r[1] <= hi]
        if sel:
            k = len(sel)
            lines.append(
                f"{label}: {k} steps, mean rows {sum(r[1] for r in sel) / k:.0f}, "
                f"execute host {1e3 * sum(r[2] for r in sel) / k:.2f} ms/step, device "
                f"{1e3 * sum(r[3] for r in sel) / k:.2f} ms/step, rest of step "
                f"{1e3 * sum(r[4] for r in sel) / k:.2f} ms/step, host-bound steps "
                f"{sum(1 for r in sel if r[2] > r[3])}")
    for gen in range(3):
        times = [t for g, t in collections if g == gen]
        if times:
            lines.append(f"gc generation {gen}: {len(times)} passes, {1e3 * sum(times):.1f} ms, "
                         f"longest {1e3 * max(times):.1f} ms")
    print("# split " + "\n# split ".join(lines), file=sys.stderr, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    for label, profs in profiles.items():
        if profs:
            text.write(f"==== {label} steps: {len(profs)} (whole engine.step, cProfile)\n")
            stats = pstats.Stats(*profs, stream=text)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(30)
    if text.getvalue():
        path.with_suffix(".pstats.txt").write_text(text.getvalue())
    path.write_text("\n".join(lines) + "\n" + "\n".join(
        f"{'E' if e else 'G'} rows={n} host_ms={1e3 * h:.2f} device_ms={1e3 * d:.2f} "
        f"rest_ms={1e3 * o:.2f}" for e, n, h, d, o in rows) + "\n")


def markdown(results: list[dict]) -> str:
    if results and "step_ms" in results[0]:
        lines = ["| case | adapters | step (ms) | floor (ms) | step / floor |",
                 "|---|---|---|---|---|"]
        lines += [f"| {r['system']} | {r['adapters']} | {r['step_ms']:.2f} | "
                  f"{r['floor_ms']:.2f} | {r['ratio']:.2f} |" for r in results]
        return "\n".join(lines)
    lines = [
        "| system | adapters | output tok/s | TTFT p50 / p99 (ms) | per-token p50 / p99 (ms) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['system']} | {r.get('adapters', '')} | {r['output_tok_s']:.1f} | "
            f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | "
            f"{r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("cpu", "cuda", "decode-step", "host-step"),
                   default="cpu")
    p.add_argument("--adapters", type=int, nargs="+", default=None)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--rate", type=float, default=float("inf"), help="req/s; inf = offline")
    p.add_argument("--prompt-min", type=int, default=128)
    p.add_argument("--prompt-max", type=int, default=128)
    p.add_argument("--output-min", type=int, default=64)
    p.add_argument("--output-max", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-batched-tokens", type=int, default=512)
    p.add_argument("--kv-blocks", type=int, default=512)
    p.add_argument("--hf-batch", type=int, default=32)
    p.add_argument("--hf-max-adapters", type=int, default=16)
    p.add_argument("--hf-requests", type=int, default=None,
                   help="HF + PEFT runs only the trace's first N requests (default: all)")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--only-hf", action="store_true",
                   help="cuda mode: only the HF + PEFT run (its own device call on a long trace)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="cuda mode: >1 = both engines side by side, R alternating rounds")
    p.add_argument("--shape", choices=("llama3-8b", "tiny"), default="llama3-8b")
    p.add_argument("--device", default="cuda", help="random-weights mode device")
    p.add_argument("--dtype", default="bfloat16", help="random-weights mode dtype")
    p.add_argument("--steps", type=int, default=20, help="decode-step mode: timed steps")
    p.add_argument("--bandwidth", type=float, default=4073.0,
                   help="decode-step mode: HBM GB/s for the floor (BENCHMARKS.md, H200)")
    p.add_argument("--profile", action="store_true",
                   help="decode-step and cuda modes: write torch.profiler tables to --out")
    p.add_argument("--split-eager", action="store_true",
                   help="cuda mode: host enqueue vs device time of each step (split_eager)")
    p.add_argument("--host-profile", action="store_true",
                   help="with --split-eager: cProfile of eager steps and of stalled steps")
    p.add_argument("--piecewise", action=argparse.BooleanOptionalAction, default=True,
                   help="cuda mode: mixed steps as piecewise CUDA graphs (both engines; the "
                        "engine's default)")
    p.add_argument("--no-graphs", action="store_true", help="disable CUDA graphs")
    p.add_argument("--pool", action="store_true",
                   help="cuda mode: LoRA factors and KV in the agent's unified page pool")
    p.add_argument("--pool-host-gib", type=int, default=16,
                   help="--pool: host tier bytes for the adapters' packed images")
    p.add_argument("--fold", action="store_true",
                   help="cuda mode: decode steps fold the LoRA into the base GEMMs")
    p.add_argument("--scheduling", nargs="+", choices=("auto", "sync", "async"),
                   default=["auto"], help="decode-step mode: engine loop(s) to measure "
                   "(auto: the engine default, async with CUDA graphs)")
    p.add_argument("--workdir", default="/tmp/adapterplane-bench-engine")
    p.add_argument("--out", default=None, help="directory for results.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.adapters is None:
        args.adapters = [8] if args.mode == "cpu" else [1, 16, 128]
    runners = {"cpu": cpu_main, "cuda": cuda_main, "decode-step": decode_step_main,
               "host-step": host_step_main}
    results = runners[args.mode](args)
    if args.mode == "cpu":
        for r in results:
            r.setdefault("adapters", args.adapters[0] if r["system"] != "engine-base" else 0)
    print(markdown(results))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "engine_results.json").write_text(
            json.dumps({"args": vars(args), "results": results}, indent=2, default=str)
        )


if __name__ == "__main__":
    main()
