"""The agent's CPU engine at its default settings against HF transformers (+ PEFT).

Workload (the CPU serving case of docs/PERFORMANCE.md): SmolLM2-135M fp32 on the CPU,
`--adapters` PEFT adapters of rank `--rank` on `--targets`, `--requests` requests of
`--prompt` random-id prompt tokens and `--output` greedy output tokens (EOS ignored), all
submitted at once; request i uses adapter i mod N (`--assign round-robin`), or one drawn
uniformly per request with a fixed seed (`--assign uniform`, as bench/serving.py draws
them: unequal rows per adapter in every step).

Arms, each built once and then run in A/B-interleaved rounds (round r runs the arms in
a rotated order, on prompts of its own so no round hits the prefix cache of an earlier
one):
  agent+lora    the engine exactly as the agent builds it (`agent.engine_factory.
                engine_spec` of default `AgentSettings`: pool, fold decision, sizes),
                the adapters registered, every request on its adapter
  agent-base    the same engine, the same prompts, no adapter (the agent's base requests)
  engine-nolora the agent's engine with LoRA off (`max_slots=0`)
  agent+lora+fold (only when named) the agent's engine with the LoRA fold forced on
  hf            HF `generate`, one batch of all requests (no padding: equal lengths)
  hf+peft       HF + PEFT `generate` with a mixed batch (`adapter_names`)
Every engine is warmed up first (untimed, its own prompts, 2 tokens each).

Reported (JSON, `--out`): output tok/s of every arm and round, the median per arm, the
ratios the CPU targets name, `cat /proc/loadavg` before and after each measured run
(the 2-core machine is shared), and whether the greedy tokens agree: agent+lora against
hf+peft and both no-adapter engine arms against hf, per request (first mismatch index).

    .venv/bin/python bench/cpu_serving_step.py --rounds 3 --out /tmp/cpu-step
    .venv/bin/python bench/cpu_serving_step.py --arms agent+lora engine-nolora --rounds 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.config import AgentSettings
from agent.engine_factory import engine_spec
from dataplane.core import SamplingParams
from dataplane.engine import Engine, build_engine

ARMS = ("agent+lora", "agent-base", "engine-nolora", "hf", "hf+peft")
EXTRA_ARMS = ("agent+lora+fold",)
"""Not run by default: the agent's engine with `lora_fold=on` (what `auto` declines on
the CPU), every request on its adapter."""
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
Prompts = list[list[int]]
Tokens = list[list[int]]


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def prompts_for(round_: int, args: argparse.Namespace, vocab: int) -> Prompts:
    """`--requests` random-id prompts of round `round_` (-1: the warm-up's)."""
    gen = torch.Generator().manual_seed(args.seed + 1000 * (round_ + 1))
    return [torch.randint(3, vocab, (args.prompt,), generator=gen).tolist()
            for _ in range(args.requests)]


def adapter_dirs(args: argparse.Namespace, base_dir: Path) -> list[Path]:
    from dataplane.assets import make_peft_adapter

    dirs = []
    for i in range(args.adapters):
        dest = Path(args.workdir) / f"adapter-r{args.rank}-{'-'.join(args.targets)}-{i}"
        if not (dest / "adapter_model.safetensors").is_file():
            make_peft_adapter(base_dir, dest, seed=100 + i, rank=args.rank, alpha=2 * args.rank,
                              target_modules=list(args.targets))
        dirs.append(dest)
    return dirs


def run_engine(engine: Engine, prompts: Prompts, handles: list[Any], new: int) -> Tokens:
    """All requests at once; step until done; the greedy tokens of each request."""
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params,
                           handles[i % len(handles)] if handles else None)
    got: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    return [got[f"r{i}"] for i in range(len(prompts))]


def run_hf(model: Any, prompts: Prompts, names: list[str] | None, new: int) -> Tokens:
    """One static batch through `generate` (greedy, `new` tokens each)."""
    ids = torch.tensor(prompts)
    kwargs: dict[str, Any] = {}
    if names:
        kwargs["adapter_names"] = [names[i % len(names)] for i in range(len(prompts))]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, pad_token_id=0, **kwargs)
    return [row[ids.shape[1]:].tolist() for row in out]


def per_request(args: argparse.Namespace, items: list[Any]) -> list[Any]:
    """`items` (one per adapter) as `run_engine` / `run_hf` index them: as they are for
    round-robin, else one drawn per request (seeded)."""
    if args.assign == "round-robin" or not items:
        return items
    rng = random.Random(args.seed)
    return [items[rng.randrange(len(items))] for _ in range(args.requests)]


def build_arms(args: argparse.Namespace, base_dir: Path, dirs: list[Path]
               ) -> dict[str, Callable[[Prompts], Tokens]]:
    """Each arm as `prompts -> tokens`, built and (engines) warmed up."""
    from dataplane.engine.adapters import load_peft_adapter

    pages = {} if args.num_kv_blocks is None else {"num_kv_blocks": args.num_kv_blocks}
    settings = AgentSettings(model_dir=base_dir, require_auth=False, **pages)
    spec = engine_spec(settings)
    arms: dict[str, Callable[[Prompts], Tokens]] = {}
    warm = prompts_for(-1, args, args.vocab)
    if "agent+lora" in args.arms or "agent-base" in args.arms:
        engine = build_engine(spec)
        assert engine.base_abi is not None
        handles = [engine.register_loaded_adapter(load_peft_adapter(d, engine.base_abi,
                                                                    settings.max_rank))
                   for d in dirs]
        run_engine(engine, warm, handles, 2)
        counts = engine.pool.pool.pages.counts()
        print(f"# agent engine: fold {engine.config.lora_fold}, max_slots "
              f"{engine.config.max_slots}, pool pages {counts.total} ({counts.adapter} "
              f"adapter pages), torch threads {torch.get_num_threads()}",
              file=sys.stderr, flush=True)
        arms["agent+lora"] = partial(run_engine, engine, handles=per_request(args, handles),
                                     new=args.output)
        arms["agent-base"] = partial(run_engine, engine, handles=[], new=args.output)
    if "agent+lora+fold" in args.arms:
        folded = build_engine(dataclasses.replace(spec, lora_fold="on"))
        assert folded.base_abi is not None
        fold_handles = [folded.register_loaded_adapter(
            load_peft_adapter(d, folded.base_abi, settings.max_rank)) for d in dirs]
        run_engine(folded, warm, fold_handles, 2)
        arms["agent+lora+fold"] = partial(run_engine, folded,
                                          handles=per_request(args, fold_handles),
                                          new=args.output)
    if "engine-nolora" in args.arms:
        plain = build_engine(dataclasses.replace(
            spec, config=dataclasses.replace(spec.config, max_slots=0)))
        run_engine(plain, warm, [], 2)
        arms["engine-nolora"] = partial(run_engine, plain, handles=[], new=args.output)
    if "hf" in args.arms or "hf+peft" in args.arms:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
        if "hf" in args.arms:
            arms["hf"] = partial(run_hf, hf, names=None, new=args.output)
        if "hf+peft" in args.arms:
            hf2 = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
            peft = PeftModel.from_pretrained(hf2, dirs[0], adapter_name="a0")
            for i, d in enumerate(dirs[1:], start=1):
                peft.load_adapter(d, adapter_name=f"a{i}")
            peft.eval()
            names = [f"a{i}" for i in range(len(dirs))]
            arms["hf+peft"] = partial(run_hf, peft, names=per_request(args, names),
                                      new=args.output)
    return {name: arms[name] for name in args.arms}


def compare(a: Tokens, b: Tokens) -> dict[str, Any]:
    """Requests whose greedy tokens agree, and each disagreeing one's first mismatch."""
    firsts = {}
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            firsts[i] = next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                             min(len(x), len(y)))
    return {"identical": len(a) - len(firsts), "requests": len(a), "first_mismatch": firsts}


RATIOS = {"lora_keep_vs_nolora": ("agent+lora", "engine-nolora"),
          "lora_vs_hf_peft": ("agent+lora", "hf+peft"),
          "nolora_vs_hf": ("engine-nolora", "hf"),
          "agent_base_vs_nolora": ("agent-base", "engine-nolora")}
CHECKS = {"agent+lora": "hf+peft", "agent+lora+fold": "hf+peft", "agent-base": "hf",
          "engine-nolora": "hf"}
"""Each engine arm's greedy tokens against the HF arm that must give the same ones."""


def summary(rows: list[dict[str, Any]], tokens: dict[tuple[str, int], Tokens]) -> dict:
    """Median tok/s per arm, the target ratios (per thread count: ``name@Nt``) and the
    greedy checks (every thread count of an arm against every one of its reference)."""
    med = {arm: statistics.median(r["output_tok_s"] for r in rows if r["arm"] == arm)
           for arm in dict.fromkeys(r["arm"] for r in rows)}
    out: dict[str, Any] = {"median_tok_s": med}
    suffixes = dict.fromkeys(a.partition("@")[1] + a.partition("@")[2] for a in med)
    for suffix in suffixes:
        for name, (num, den) in RATIOS.items():
            if num + suffix in med and den + suffix in med:
                out[name + suffix] = med[num + suffix] / med[den + suffix]
    checks: dict[str, list[dict[str, Any]]] = {}
    for (arm, r), got in tokens.items():
        ref = CHECKS.get(arm.partition("@")[0])
        for (other, r2), want in tokens.items():
            if r2 == r and other.partition("@")[0] == ref:
                checks.setdefault(f"{arm} vs {other}", []).append(compare(got, want))
    out["greedy_equality"] = checks
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arms", nargs="+", choices=ARMS + EXTRA_ARMS, default=list(ARMS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--targets", nargs="+", default=list(ALL_LINEAR))
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--assign", choices=("round-robin", "uniform"), default="round-robin",
                   help="which adapter each request uses")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="torch intra-op thread counts: every arm runs at each (arm@Nt); "
                        "default: as the process starts (the agent's)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="the agent's pool pages (default: the agent's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="/tmp/adapterplane-cpu-step",
                   help="SmolLM2 checkpoint and the PEFT adapters (cached)")
    p.add_argument("--out", default=None, help="directory for cpu_serving_step.json")
    args = p.parse_args()
    from dataplane.assets import prepare_smollm2

    base_dir = prepare_smollm2(Path(args.workdir) / "smollm2")
    args.vocab = json.loads((base_dir / "config.json").read_text())["vocab_size"]
    arms = build_arms(args, base_dir, adapter_dirs(args, base_dir))
    rows: list[dict[str, Any]] = []
    tokens: dict[tuple[str, int], Tokens] = {}
    threads: dict[str, int | None] = {name: None for name in arms} if not args.threads else {
        f"{name}@{n}t": n for name in arms for n in args.threads}
    names = list(threads)
    for r in range(args.rounds):
        prompts = prompts_for(r, args, args.vocab)
        for name in names[r % len(names):] + names[:r % len(names)]:
            count = threads[name]
            if count is not None:
                torch.set_num_threads(count)
            before = loadavg()
            t0 = time.perf_counter()
            tokens[(name, r)] = arms[name.split("@")[0]](prompts)
            wall = time.perf_counter() - t0
            n = sum(len(t) for t in tokens[(name, r)])
            rows.append({"arm": name, "round": r, "output_tok_s": n / wall, "wall_s": wall,
                         "output_tokens": n, "loadavg_before": before,
                         "loadavg_after": loadavg()})
            print(f"# round {r} {name}: {n / wall:.1f} tok/s ({wall:.1f} s; load "
                  f"{before.split()[0]} -> {rows[-1]['loadavg_after'].split()[0]})",
                  file=sys.stderr, flush=True)
    result = {"args": {k: v for k, v in vars(args).items()}, "torch": torch.__version__,
              "torch_threads": torch.get_num_threads(), "rows": rows,
              **summary(rows, tokens)}
    print(json.dumps({k: result[k] for k in result if k not in ("rows", "args")}, indent=1))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cpu_serving_step.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
