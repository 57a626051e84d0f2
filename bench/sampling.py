"""Decode-step cost of the sampler's per-row features: logprobs, penalties, logit bias.

One engine (random-weights base, no adapters), `--batch` requests decoding at context
`--ctx`. Each scenario gives a fraction of the rows a feature (the other rows plain
greedy) and times `--steps` decode steps (`engine.step()` intervals, median):

- `argmax`: a sampler that only takes each row's argmax (the floor: no per-row logic);
- `none`: the product sampler, no row asking for anything;
- `logprobs5`: top-5 logprobs; `penalties`: repetition 1.1 + frequency 0.5 + presence 0.5;
  `bias`: a logit_bias of 16 token ids; `grammar`: a JSON-schema response_format (a long
  array of strings: the rows stay constrained; masks filled on the host each step, and no
  step is launched ahead while a constrained row decodes); each on `--fractions` of the
  rows. The grammar reads the base's tokenizer: `--tokenizer` (a tokenizer.json of its
  vocabulary, e.g. Llama-3's for the 8B shape), else a synthetic byte-level one (random
  pieces: far more of them hold JSON punctuation than a real vocabulary's, so its masks
  cost more).

Scenarios run in `--rounds` interleaved rounds; ratios are against `none` and `argmax`
of the same run (medians over rounds). Results: `--out`/sampling.json.

    python bench/sampling.py                                                     # CPU, tiny
    python bench/sampling.py --shape llama3-8b --device cuda --dtype bfloat16 \\
        --batch 64 --ctx 512 --kv-blocks 4096 --tokenizer llama3/tokenizer.json --out $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence as SequenceOf
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.synthetic import (
    BLOCK_SIZE,
    SHAPES,
    add_serving_args,
    random_base,
    save_results,
    step_intervals,
    sync,
)
from dataplane.assets.byte_tokenizer import synthetic_tokenizer
from dataplane.core import ResponseFormat, SamplingParams, Sequence
from dataplane.engine import Engine, EngineSpec, build_engine
from dataplane.engine.builder import DTYPES
from dataplane.sampling.logits_processors import PendingTokens
from dataplane.sampling.sampler import PendingSample, Sampler
from dataplane.tokenizer import Tokenizer

LONG_JSON = {"type": "object", "properties": {"items": {
    "type": "array", "minItems": 1000,
    "items": {"type": "string", "minLength": 8, "maxLength": 24}}}, "required": ["items"]}
"""A JSON schema whose answers outlast the timed steps (the rows stay constrained)."""

FEATURES: dict[str, dict[str, object]] = {
    "logprobs5": {"logprobs": 5},
    "penalties": {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5},
    "bias": {"logit_bias": tuple((7 + 13 * i, 2.0) for i in range(16))},
    "grammar": {"response_format": ResponseFormat.from_schema(LONG_JSON), "ignore_eos": False},
}


class ArgmaxSampler(Sampler):
    """Each row's argmax and nothing else: the floor the product sampler is measured
    against."""

    def launch(self, logits: torch.Tensor, seqs: SequenceOf[Sequence],
               pending: PendingTokens | None = None,
               masks: tuple[torch.Tensor, SequenceOf[int]] | None = None) -> PendingSample:
        tokens = logits.argmax(dim=-1)
        host = tokens
        if tokens.device.type == "cuda":
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
        return PendingSample(tokens, (host,), [None] * len(seqs))


def load_tokenizer(path: str, vocab_size: int, eos: int) -> Tokenizer:
    """A tokenizer.json cut to the model's vocabulary (added tokens past it dropped)."""
    spec = json.loads(Path(path).read_text())
    spec["added_tokens"] = [t for t in spec.get("added_tokens", []) if t["id"] < vocab_size]
    return Tokenizer(HFTokenizer.from_str(json.dumps(spec)), special_tokens={},
                     eos_token_ids=[eos], chat_template=None)


def scenario_params(feature: str | None, fraction: float, batch: int, max_tokens: int
                    ) -> list[SamplingParams]:
    """Row i asks for `feature` when i < fraction * batch; every row is greedy."""
    asking = round(fraction * batch)
    extra = FEATURES[feature] if feature else {}
    return [SamplingParams(**{"temperature": 0.0, "max_tokens": max_tokens,  # type: ignore[arg-type]
                              "ignore_eos": True, **(extra if i < asking else {})})
            for i in range(batch)]


def time_scenario(engine: Engine, prompts: list[list[int]], params: list[SamplingParams],
                  steps: int, device: str, tag: str) -> float:
    """Median decode-step seconds of `params` rows, after their prefill; then aborted."""
    for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"{tag}-{i}", prompt, sp)
    while engine.scheduler.waiting or any(s.in_prefill for s in engine.scheduler.running):
        engine.step()
    median = statistics.median(step_intervals(engine, steps, device))
    for i in range(len(prompts)):
        engine.abort(f"{tag}-{i}")
    while engine.has_unfinished():
        engine.step()
    sync(device)
    return median


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_serving_args(p)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fractions", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--features", nargs="+", default=sorted(FEATURES), choices=sorted(FEATURES))
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json of the base's vocabulary for the grammar rows "
                        "(default: a synthetic byte-level one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = random_base(SHAPES[args.shape], DTYPES[args.dtype], args.device, seed=args.seed)
    config = base.model.config
    eos = min([e for e in config.eos_token_ids if e < config.vocab_size] or [2])
    tokenizer = (load_tokenizer(args.tokenizer, config.vocab_size, eos) if args.tokenizer
                 else synthetic_tokenizer(config.vocab_size, eos, seed=args.seed))
    base = dataclasses.replace(base, tokenizer=tokenizer)  # for the grammar rows
    engine = build_engine(EngineSpec.of(
        base, dtype=args.dtype, device=args.device, max_slots=0, num_kv_blocks=args.kv_blocks,
        block_size=BLOCK_SIZE, max_num_seqs=max(args.batch, args.max_num_seqs),
        max_num_batched_tokens=max(args.max_batched_tokens, args.batch * args.ctx),
        enable_prefix_caching=False))
    product, floor = engine.sampler, ArgmaxSampler(eos_token_ids=engine.sampler.eos_token_ids)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = base.model.config.vocab_size
    prompts = [torch.randint(3, vocab, (args.ctx,), generator=gen).tolist()
               for _ in range(args.batch)]
    max_tokens = 3 * args.steps + 32
    cases: list[tuple[str, str | None, float]] = [("argmax", None, 0.0), ("none", None, 0.0)]
    cases += [(f"{f}@{fr:g}", f, fr) for f in args.features for fr in args.fractions]
    times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    time_scenario(engine, prompts, scenario_params(None, 0, args.batch, max_tokens),
                  args.steps, args.device, "warm")
    for r in range(args.rounds):
        for name, feature, fraction in cases:
            engine.sampler = floor if name == "argmax" else product
            times[name].append(time_scenario(
                engine, prompts, scenario_params(feature, fraction, args.batch, max_tokens),
                args.steps, args.device, f"r{r}-{name}"))
    engine.sampler = product
    med = {name: statistics.median(v) for name, v in times.items()}
    results = [{"scenario": name, "step_ms": 1e3 * med[name],
                "over_none": med[name] / med["none"], "over_argmax": med[name] / med["argmax"]}
               for name, _, _ in cases]
    for row in results:
        print(row, flush=True)
    save_results(args.out, "sampling.json", args, results)
    engine.shutdown()


if __name__ == "__main__":
    main()
