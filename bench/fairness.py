"""Noisy neighbour: two tenants on one engine, tenant A offering `--ratio` times tenant B's
request rate, under each scheduling policy, against B alone.

Each tenant has its own adapters (request i of a tenant on its adapter i mod `--adapters`,
all pinned in the engine's pool). Arrivals are Poisson at `--rate-b` (B) and `--ratio` x
that (A) for `--duration-s` seconds of wall clock; the loop adds each request when its
arrival time has passed and steps the engine until every request has finished. Reported
per policy:

* B's TTFT p50 / p99 (arrival to first token) and their ratio to B running alone;
* each tenant's share of the completed weighted service gained over the steps in which
  both tenants had requests waiting for admission (`Engine.tenant_service`, the service
  the fair policy equalises): with equal weights the fair policy should give B about half;
* output tok/s and how many of the steps both tenants were backlogged.

For B to be backlogged at all its own rate must reach about half the engine's capacity,
so the defaults overload the engine (A alone offers ~5x what it can serve).

    python bench/fairness.py --out /tmp/fair                                  # CPU, tiny
    python bench/fairness.py --shape llama3-8b --device cuda --dtype bfloat16 \\
        --rate-b 8 --duration-s 20 --max-num-seqs 64 --kv-blocks 8192 --out $OUT/fair
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.synthetic import (
    BLOCK_SIZE,
    SHAPES,
    adapters_for,
    percentile,
    pool_pages,
    random_base,
    save_results,
)
from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.builder import DTYPES

TENANTS = ("A", "B")


@dataclass
class Arrival:
    t: float
    tenant: str
    index: int
    prompt: list[int]
    max_tokens: int


@dataclass
class Outcome:
    ttft: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TENANTS})
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    both_backlogged_steps: int = 0
    backlogged_gain: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TENANTS, 0.0))


def arrivals(args: argparse.Namespace, vocab: int, tenants: tuple[str, ...]) -> list[Arrival]:
    """Each tenant's arrivals from a stream of its own: B's are the same alone and with A."""
    out = []
    for k, tenant in enumerate(TENANTS):
        gen = torch.Generator().manual_seed(args.seed + 1000 * k)
        if tenant not in tenants:
            continue
        rate = args.rate_b * (args.ratio if tenant == "A" else 1.0)
        t, i = 0.0, 0
        while True:
            t += float(torch.empty(1).exponential_(rate, generator=gen))
            if t >= args.duration_s:
                break
            plen = int(torch.randint(args.prompt_min, args.prompt_max + 1, (1,), generator=gen))
            olen = int(torch.randint(args.output_min, args.output_max + 1, (1,), generator=gen))
            out.append(Arrival(t, tenant, i, torch.randint(3, vocab, (plen,),
                                                             generator=gen).tolist(), olen))
            i += 1
    return sorted(out, key=lambda a: a.t)


def run(args: argparse.Namespace, policy: str, tenants: tuple[str, ...]) -> Outcome:
    dtype = DTYPES[args.dtype]
    base = random_base(SHAPES[args.shape], dtype, args.device, seed=args.seed)
    model = base.model
    per = {t: adapters_for(model.config, args.adapters, dtype, f"fair-{t}") for t in TENANTS}
    engine = build_engine(EngineSpec.of(
        base, dtype=args.dtype, device=args.device, max_slots=2 * args.adapters, max_rank=16,
        num_kv_blocks=pool_pages(model, per["A"] + per["B"], args.kv_blocks),
        block_size=BLOCK_SIZE, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens, scheduling_policy=policy,
        enable_prefix_caching=False))
    handles = {t: [engine.register_loaded_adapter(a) for a in per[t]] for t in TENANTS}
    warm = SamplingParams(temperature=0.0, max_tokens=args.output_max, ignore_eos=True)
    engine.generate([[5] * args.prompt_max] * args.max_num_seqs, warm,
                    [handles["A"][i % args.adapters] for i in range(args.max_num_seqs)])
    todo = arrivals(args, model.config.vocab_size, tenants)
    born: dict[str, tuple[str, float]] = {}
    outcome = Outcome()
    pending = list(todo)
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0].t <= now:
            a = pending.pop(0)
            rid = f"{a.tenant}{a.index}"
            params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
            engine.add_request(rid, a.prompt, params,
                               handles[a.tenant][a.index % args.adapters], tenant=a.tenant)
            born[rid] = (a.tenant, start + a.t)
        if not engine.has_unfinished():
            time.sleep(min(0.001, max(0.0, pending[0].t - now)))
            continue
        waiting = {s.tenant for s in engine.scheduler.waiting}
        before = engine.tenant_service()
        outs = engine.step()
        outcome.steps += 1
        if waiting >= set(TENANTS):
            after = engine.tenant_service()
            outcome.both_backlogged_steps += 1
            for t in TENANTS:
                outcome.backlogged_gain[t] += after.get(t, 0.0) - before.get(t, 0.0)
        stamp = time.perf_counter()
        for o in outs:
            outcome.tokens += len(o.new_token_ids)
            if len(o.token_ids) == len(o.new_token_ids) and o.new_token_ids:
                tenant, t0 = born[o.request_id]
                outcome.ttft[tenant].append(stamp - t0)
    outcome.seconds = time.perf_counter() - start
    return outcome


def summary(policy: str, o: Outcome, alone: Outcome | None) -> dict[str, object]:
    gain = sum(o.backlogged_gain.values())
    row: dict[str, object] = {
        "policy": policy, "output_tok_s": o.tokens / o.seconds, "steps": o.steps,
        "both_backlogged_steps": o.both_backlogged_steps,
        "b_share_backlogged": o.backlogged_gain["B"] / gain if gain else None,
        "requests": {t: len(o.ttft[t]) for t in TENANTS}}
    for t in TENANTS:
        if o.ttft[t]:
            row[f"{t.lower()}_ttft_p50_ms"] = 1e3 * percentile(o.ttft[t], 50)
            row[f"{t.lower()}_ttft_p99_ms"] = 1e3 * percentile(o.ttft[t], 99)
    if alone is not None and o.ttft["B"] and alone.ttft["B"]:
        row["b_ttft_p50_vs_alone"] = percentile(o.ttft["B"], 50) / percentile(alone.ttft["B"], 50)
        row["b_ttft_p99_vs_alone"] = percentile(o.ttft["B"], 99) / percentile(alone.ttft["B"], 99)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--adapters", type=int, default=4, help="adapters per tenant")
    p.add_argument("--rate-b", type=float, default=40.0, help="tenant B's requests per second")
    p.add_argument("--ratio", type=float, default=10.0, help="tenant A's rate over B's")
    p.add_argument("--duration-s", type=float, default=4.0)
    p.add_argument("--prompt-min", type=int, default=16)
    p.add_argument("--prompt-max", type=int, default=64)
    p.add_argument("--output-min", type=int, default=8)
    p.add_argument("--output-max", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=512)
    p.add_argument("--kv-blocks", type=int, default=512)
    p.add_argument("--policies", nargs="+", default=["fair", "fcfs"],
                   choices=["fair", "fcfs", "newest_first"])
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    alone = run(args, "fair", ("B",))
    rows = [{**summary("B alone", alone, None)}]
    for policy in args.policies:
        rows.append(summary(policy, run(args, policy, TENANTS), alone))
    for row in rows:
        print(row)
    save_results(args.out, "fairness.json", args, rows)


if __name__ == "__main__":
    main()
