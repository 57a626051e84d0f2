"""Tenant fairness and overload on one engine, under each scheduling policy (`--scenario`).

noisy (the default): two tenants, tenant A offering `--ratio` times tenant B's request
rate, under each of `--policies`, against B alone. Each tenant has its own adapters
(request i of a tenant on its adapter i mod `--adapters`, all pinned in the engine's pool).
Arrivals are Poisson at `--rate-b` (B) and `--ratio` x that (A) for `--duration-s` seconds
of wall clock; the loop adds each request when its arrival time has passed and steps the
engine until every request has finished. Reported per policy:

* B's TTFT p50 / p99 (arrival to first token) and their ratio to B running alone;
* each tenant's share of the completed weighted service gained over the steps in which
  both tenants had requests waiting for admission (`Engine.tenant_service`, the service
  the fair policy equalises): with equal weights the fair policy should give B about half;
* output tok/s and how many of the steps both tenants were backlogged.

For B to be backlogged at all its own rate must reach about half the engine's capacity,
so the defaults overload the engine (A alone offers ~5x what it can serve).

policy-throughput: what fairness costs in throughput. One trace of `--requests` requests
(request i on adapter i mod `--trace-adapters`, all pinned, and of tenant ns{i mod
`--tenants`}, equal weights) served by an fcfs and a fair engine built side by side,
`--rounds` rounds in alternating order (fcfs first in even rounds): closed loop with
`--concurrency` requests live (`--rate inf`, the default: a queue always waits, so the
policy has a choice every step) or Poisson at `--rate`. Reported per round and policy:
output tok/s, output tokens (every request runs to its max_tokens), TTFT p50 / p99; then
each policy's median tok/s and the median of the rounds' fair / fcfs ratios (target:
within 3% of 1).

overload-ramp: goodput under queue deadlines. First the engine's capacity (requests/s
completed closed-loop at `--concurrency`, the same request shape, on the fcfs engine),
then Poisson arrivals whose rate rises linearly from `--ramp` LO to HI times that capacity
over `--ramp-s` seconds, every request with queue deadline `--max-queue-s`, served under
fcfs, fair and newest_first (one engine each, in turn, the same arrivals). Reported per
policy: goodput (requests that met their deadline, i.e. finished not by "deadline", per
second of the run, from the arrivals' time 0 to the last finish), offered / admitted /
expired over the run (`Engine.admission_counts()`; unadmitted = offered - admitted -
expired, 0 once drained), and goodput over fcfs's.

Results: `--out`/fairness.json (noisy), fairness_policy_throughput.json,
fairness_overload_ramp.json (bench/synthetic.py `save_results`); rows printed as dicts.

    python bench/fairness.py --out /tmp/fair                                  # CPU, tiny
    python bench/fairness.py --scenario all --out /tmp/fair                   # CPU, tiny
    python bench/fairness.py --shape llama3-8b --device cuda --dtype bfloat16 \\
        --rate-b 8 --duration-s 20 --max-num-seqs 64 --kv-blocks 8192 --out $OUT/fair
    python bench/fairness.py --scenario policy-throughput --shape llama3-8b --device cuda \\
        --dtype bfloat16 --trace-adapters 128 --tenants 4 --requests 512 --rounds 3 \\
        --prompt-min 64 --prompt-max 512 --output-min 64 --output-max 128 \\
        --max-num-seqs 128 --max-batched-tokens 4096 --kv-blocks 8192 --out $OUT/fair
    python bench/fairness.py --scenario overload-ramp --shape llama3-8b --device cuda \\
        --dtype bfloat16 --trace-adapters 128 --tenants 4 --ramp-s 20 --max-queue-s 2 \\
        --capacity-requests 512 --prompt-min 64 --prompt-max 512 --output-min 64 \\
        --output-max 128 --max-num-seqs 128 --max-batched-tokens 4096 --kv-blocks 8192 \\
        --out $OUT/fair
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.synthetic import SHAPES, adapters_for, add_serving_args, percentile, save_results
from bench.tenant_serving import (
    Offer,
    Served,
    build_pinned,
    closed_loop_capacity,
    free_device_memory,
    offers,
    ramp_times,
    serve,
    tenant_trace,
    warm_up,
)
from dataplane.core import SamplingParams
from dataplane.engine import Engine
from dataplane.engine.builder import DTYPES
from dataplane.engine.fairness import POLICIES
from dataplane.models import ModelConfig

TENANTS = ("A", "B")
SCENARIOS = ("noisy", "policy-throughput", "overload-ramp")


def model_config(args: argparse.Namespace) -> ModelConfig:
    """`--shape`'s config (the one `build_pinned`'s base gets), for adapters and vocab."""
    return ModelConfig.from_dict(dict(SHAPES[args.shape]))


def latency_ms(ttfts: list[float], prefix: str = "") -> dict[str, float]:
    """TTFT p50 / p99 in ms (NaN without any)."""
    return {f"{prefix}ttft_p50_ms": 1e3 * percentile(ttfts, 50),
            f"{prefix}ttft_p99_ms": 1e3 * percentile(ttfts, 99)}


# ----- noisy neighbour ------------------------------------------------------------------
@dataclass
class Arrival:
    t: float
    tenant: str
    index: int
    prompt: list[int]
    max_tokens: int


@dataclass
class BacklogShares:
    """The service each tenant gained over the steps in which every tenant had requests
    waiting for admission (a `serve` step watch)."""

    steps: int = 0
    gain: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TENANTS, 0.0))
    _before: dict[str, float] | None = None

    def before_step(self, engine: Engine) -> None:
        waiting = {s.tenant for s in engine.scheduler.waiting}
        self._before = engine.tenant_service() if waiting >= set(TENANTS) else None

    def after_step(self, engine: Engine) -> None:
        if self._before is None:
            return
        after = engine.tenant_service()
        self.steps += 1
        for t in TENANTS:
            self.gain[t] += after.get(t, 0.0) - self._before.get(t, 0.0)


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


def noisy_run(args: argparse.Namespace, policy: str, tenants: tuple[str, ...]
              ) -> tuple[Served, BacklogShares]:
    config = model_config(args)
    per = {t: adapters_for(config, args.adapters, DTYPES[args.dtype], f"fair-{t}")
           for t in TENANTS}
    engine, flat = build_pinned(args, policy, per["A"] + per["B"])
    handles = {"A": flat[:args.adapters], "B": flat[args.adapters:]}
    warm = SamplingParams(temperature=0.0, max_tokens=args.output_max, ignore_eos=True)
    engine.generate([[5] * args.prompt_max] * args.max_num_seqs, warm,
                    [handles["A"][i % args.adapters] for i in range(args.max_num_seqs)])
    todo = [Offer(f"{a.tenant}{a.index}", a.t, a.prompt, a.max_tokens,
                  handles[a.tenant][a.index % args.adapters], a.tenant)
            for a in arrivals(args, config.vocab_size, tenants)]
    shares = BacklogShares()
    served = serve(engine, todo, watch=shares)
    engine.shutdown()
    return served, shares


def noisy_summary(policy: str, o: Served, shares: BacklogShares, alone: Served | None
                  ) -> dict[str, object]:
    ttft = {t: o.ttfts([f for f in o.fates.values() if f.tenant == t]) for t in TENANTS}
    gain = sum(shares.gain.values())
    row: dict[str, object] = {
        "policy": policy, "output_tok_s": o.tokens / o.seconds, "steps": o.steps,
        "both_backlogged_steps": shares.steps,
        "b_share_backlogged": shares.gain["B"] / gain if gain else None,
        "requests": {t: len(ttft[t]) for t in TENANTS}}
    for t in TENANTS:
        if ttft[t]:
            row.update(latency_ms(ttft[t], f"{t.lower()}_"))
    b_alone = [] if alone is None else alone.ttfts()
    if b_alone and ttft["B"]:
        row["b_ttft_p50_vs_alone"] = percentile(ttft["B"], 50) / percentile(b_alone, 50)
        row["b_ttft_p99_vs_alone"] = percentile(ttft["B"], 99) / percentile(b_alone, 99)
    return row


def noisy(args: argparse.Namespace) -> list[dict[str, object]]:
    alone, alone_shares = noisy_run(args, "fair", ("B",))
    rows = [noisy_summary("B alone", alone, alone_shares, None)]
    for policy in args.policies:
        rows.append(noisy_summary(policy, *noisy_run(args, policy, TENANTS), alone))
        free_device_memory()
    return rows


# ----- policy throughput ----------------------------------------------------------------
def policy_throughput(args: argparse.Namespace) -> list[dict[str, object]]:
    config = model_config(args)
    adapters = adapters_for(config, args.trace_adapters, DTYPES[args.dtype], "trace")
    engines = {p: build_pinned(args, p, adapters) for p in ("fcfs", "fair")}
    trace = tenant_trace(args, config.vocab_size, args.requests)
    for engine, handles in engines.values():
        warm_up(engine, offers(trace, handles, args.tenants, "trace"), args.device)
    closed = None if math.isfinite(args.rate) else args.concurrency
    rows: list[dict[str, object]] = []
    tok_s: dict[str, list[float]] = {p: [] for p in engines}
    ratios = []
    for i in range(args.rounds):
        order = ["fcfs", "fair"] if i % 2 == 0 else ["fair", "fcfs"]
        for policy in order:
            engine, handles = engines[policy]
            o = serve(engine, offers(trace, handles, args.tenants, f"r{i}"), concurrency=closed)
            tok_s[policy].append(o.tokens / o.seconds)
            rows.append({"policy": policy, "round": i, "output_tok_s": tok_s[policy][-1],
                         "output_tokens": o.tokens,
                         "offered_tokens": sum(r.max_tokens for r in trace),
                         "requests": len(trace), "finished": sum(
                             f.finished is not None for f in o.fates.values()),
                         "seconds": o.seconds, "steps": o.steps, **latency_ms(o.ttfts())})
        ratios.append(tok_s["fair"][-1] / tok_s["fcfs"][-1])
        print(f"# round {i} ({' then '.join(order)}): fair / fcfs {ratios[-1]:.3f}",
              file=sys.stderr, flush=True)
    rows.append({"policy": "fair / fcfs", "rounds": args.rounds,
                 "fcfs_tok_s_median": statistics.median(tok_s["fcfs"]),
                 "fair_tok_s_median": statistics.median(tok_s["fair"]),
                 "ratio_per_round": ratios, "ratio_median": statistics.median(ratios)})
    for engine, _ in engines.values():
        engine.shutdown()
    return rows


# ----- overload ramp --------------------------------------------------------------------
RAMP_POLICIES = ("fcfs", "fair", "newest_first")


def overload_ramp(args: argparse.Namespace) -> list[dict[str, object]]:
    config = model_config(args)
    adapters = adapters_for(config, args.trace_adapters, DTYPES[args.dtype], "trace")
    timed = args.capacity_requests or 4 * args.concurrency
    shape = tenant_trace(args, config.vocab_size, timed + 2 * args.concurrency,
                         [0.0] * (timed + 2 * args.concurrency))
    capacity, ramp = 0.0, []
    rows: list[dict[str, object]] = []
    goodput: list[float] = []
    for policy in RAMP_POLICIES:
        engine, handles = build_pinned(args, policy, adapters)
        warm_up(engine, offers(shape[:2 * args.concurrency], handles, args.tenants, "shape"),
                args.device)
        if not rows:  # the first engine measures the capacity the arrivals are scaled by
            capacity = closed_loop_capacity(
                engine, offers(shape, handles, args.tenants, "capacity"),
                args.concurrency, timed)
            lo, hi = args.ramp
            times = ramp_times(lo * capacity, hi * capacity, args.ramp_s, args.seed + 2)
            if not times:
                raise SystemExit("overload-ramp: no arrival in --ramp-s; make it longer")
            ramp = tenant_trace(args, config.vocab_size, len(times), times)
            print(f"# capacity {capacity:.1f} req/s (closed loop, {args.concurrency} live); "
                  f"{len(ramp)} arrivals over {args.ramp_s} s", file=sys.stderr, flush=True)
        o = serve(engine, offers(ramp, handles, args.tenants, "ramp", args.max_queue_s))
        engine.shutdown()
        del engine, handles
        free_device_memory()
        rows.append(ramp_summary(policy, o, capacity, args.ramp_s))
        goodput.append(len(o.met()) / o.seconds)
    for row, g in zip(rows, goodput, strict=True):
        row["goodput_vs_fcfs"] = g / goodput[0] if goodput[0] else None
    return rows


def ramp_summary(policy: str, o: Served, capacity: float, ramp_s: float) -> dict[str, object]:
    met = o.met()
    c = o.counts
    return {"policy": policy, "capacity_rps": capacity, "offered": c["offered"],
            "offered_rps": c["offered"] / ramp_s, "admitted": c["admitted"],
            "expired": c["expired"], "unadmitted": c["offered"] - c["admitted"] - c["expired"],
            "met": len(met), "finished_by_deadline": sum(
                f.finish_reason == "deadline" for f in o.fates.values()),
            "seconds": o.seconds, "goodput_rps": len(met) / o.seconds,
            "output_tok_s": o.tokens / o.seconds, "steps": o.steps,
            **latency_ms(o.ttfts(met), "met_")}


# ----- command line ---------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="noisy")
    add_serving_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    noisy_group = p.add_argument_group("noisy")
    noisy_group.add_argument("--adapters", type=int, default=4, help="adapters per tenant")
    noisy_group.add_argument("--rate-b", type=float, default=40.0,
                             help="tenant B's requests per second")
    noisy_group.add_argument("--ratio", type=float, default=10.0, help="tenant A's rate over B's")
    noisy_group.add_argument("--duration-s", type=float, default=4.0)
    noisy_group.add_argument("--policies", nargs="+", default=["fair", "fcfs"],
                             choices=list(POLICIES))
    trace = p.add_argument_group("policy-throughput and overload-ramp")
    trace.add_argument("--trace-adapters", type=int, default=128,
                       help="pinned adapters; request i on adapter i mod N")
    trace.add_argument("--tenants", type=int, default=4,
                       help="namespaces ns0..ns{T-1}, equal weights; request i of ns{i mod T}")
    trace.add_argument("--concurrency", type=int, default=None,
                       help="requests live in the closed loops (default 2 x --max-num-seqs)")
    trace.add_argument("--requests", type=int, default=256,
                       help="policy-throughput: requests per policy and round")
    trace.add_argument("--rate", type=float, default=math.inf,
                       help="policy-throughput: Poisson req/s (inf: closed loop)")
    trace.add_argument("--rounds", type=int, default=3, help="policy-throughput rounds")
    trace.add_argument("--ramp", type=float, nargs=2, default=[0.5, 2.0],
                       metavar=("LO", "HI"), help="overload-ramp: arrival rate at the start "
                       "and at the end, in multiples of the measured capacity")
    trace.add_argument("--ramp-s", type=float, default=3.0, help="overload-ramp: arrivals' span")
    trace.add_argument("--max-queue-s", type=float, default=0.5,
                       help="overload-ramp: every request's queue deadline (s)")
    trace.add_argument("--capacity-requests", type=int, default=None,
                       help="overload-ramp: completions timed for the capacity "
                            "(default 4 x --concurrency)")
    args = p.parse_args(argv)
    for name in ("trace_adapters", "tenants", "requests", "rounds", "max_num_seqs",
                 "adapters", "concurrency", "capacity_requests"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("rate", "ramp_s", "max_queue_s", "rate_b", "duration_s"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not all(0 < r < math.inf for r in args.ramp):
        p.error("--ramp LO HI must be finite and > 0")
    if args.concurrency is None:
        args.concurrency = 2 * args.max_num_seqs
    return args


RESULT_FILES = {"noisy": "fairness.json", "policy-throughput": "fairness_policy_throughput.json",
                "overload-ramp": "fairness_overload_ramp.json"}


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    run = {"noisy": noisy, "policy-throughput": policy_throughput,
           "overload-ramp": overload_ramp}
    for scenario in SCENARIOS if args.scenario == "all" else (args.scenario,):
        rows = run[scenario](args)
        for row in rows:
            print(row)
        save_results(args.out, RESULT_FILES[scenario], args, rows)
        free_device_memory()


if __name__ == "__main__":
    main()
