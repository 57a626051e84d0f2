"""Adapter residency under a Zipf workload larger than the slots, through the real agent loop.

The agent's engine loop (agent/serving.py `EngineLoop`) runs in this process on its own
thread, exactly as `adapterplane agent` runs it, minus HTTP and the control plane:

* an engine (`build_engine`) on a random base of `--shape` (bench/synthetic.py
  `random_base`), `--slots` adapter slots of `--rank` (the engine's and the loop's
  `max_slots`), its unified pool holding `--kv-blocks` KV blocks besides `--slots`
  adapters. The base's ABI is read (`read_base_abi`) from a checkpoint of the random
  weights written once to the work directory (and deleted again);
* `--adapters` PEFT LoRA directories (adapter_config.json + adapter_model.safetensors,
  random factors from the adapter's index, `--rank` on `--targets`), each validated
  against that ABI by `validate_peft_dir` (what the control plane's validation job
  runs), published one alias each (`ns{i mod --tenants}/a{i}`) in a desired state of
  file:// URLs with sha256 and size, applied to an `AgentCatalog` by
  `parse_desired_state`; the `--prefetch` most popular aliases are marked prefetch
  (placement's assignment) and loaded, by `EngineLoop.reconcile`, before the clock starts;
* an `ArtifactFetcher` over a fresh cache directory (every first use downloads, verifies
  and re-validates), `AgentMetrics`, and the loop, which does admission, cold loads on
  its loader threads, placement with LRU eviction of idle adapters, load retry
  (`--load-attempts`) and age-triggered load reservation (`--cold-reserve-after-s`).

Workload: requests on adapter k (0 = most popular) with probability proportional to
(k + 1)^-`--zipf` (a seeded stream of its own), Poisson arrivals at `--rate` req/s for
`--duration-s` seconds (or exactly `--requests` of them; `--rate inf`: all at once),
prompts of random ids and greedy outputs, lengths uniform in `--prompt-*` /
`--output-*` (EOS ignored). Each request is resolved in the catalog (the server's
`resolve`) when it arrives and submitted as a `Ticket` (tenant = the alias's namespace)
whose sink records its events; the bench waits for every request to end (at most
`--drain-s` after the last arrival), then stops the loop.

Reported (printed, and `--out`/zipf_residency.json via `save_results`):

* requests offered / completed (a finished output) / failed (a `ServingError`, by code;
  `OVERLOADED` ones were refused before they were queued) / unfinished (still open when
  the drain ended: 0 unless `--drain-s` was too short); output tokens and tok/s over
  the run (first arrival to last finish);
* TTFT p50 / p99 (`Ticket.created` to the first output, as the agent's TTFT metric)
  split by the ticket's residency at admission: `hit` (its adapter was in a slot) or
  `cold` (it waited for a load);
* queue wait p50 / p99 / max, overall and by class: the event ledger's own value for
  each completed request (agent/event_ledger.py: enqueue to the first plan selecting
  its rows), read by the sink as the request finishes (the ledger keeps only the
  recent ones);
* the ledger's lookups (hit / cold_miss / stale_miss; their sum is the requests queued),
  cache hit rate, load amplification (bytes transferred over bytes first used) and
  prefetch precision; loads started and published, failed attempts, evictions
  (`adapter_evictions_total`: the loop's LRU victims and the pool's own, for KV growth
  or another load); adapters in slots, time-weighted mean over the run and at its end
  (from the status samples below; `--no-prefix-caching` shows what the engine's prefix
  cache costs the residency);
* load waits: an adapter *waits for its load* while the loop's published status
  (`EngineLoop.status["slots"]`, replaced every loop iteration) shows its resident in
  state `loading` with `waiting` > 0, i.e. requests are queued for it and its factors
  are not yet published in a slot (downloading, read but without a free slot or KV
  room, or a failed attempt's backoff). The bench samples the status between arrivals
  (about every 2 ms, each new status once); a wait runs from the first sample showing it
  to the first sample no longer showing it: each end is seen at most one loop iteration
  plus one sample interval late, so a wait's length is off by at most that much.
  `load_starved` lists the adapters whose longest such wait exceeded `--starve-s`
  (expected: none; a load the slots or the KV starve shows up here).

CPU (tiny random Llama; TRITON_INTERPRET=1 when no GPU is present):

    TRITON_INTERPRET=1 python bench/zipf_residency.py --adapters 200 --slots 32 \\
        --rate 40 --duration-s 10 --threads 2 --out /tmp/zipf

GPU (Llama-3-8B shape, bf16; 1000 rank-8 q_proj/v_proj adapters, 6.8 MB each; under 4
minutes on one H200, more than half of it writing the checkpoint and the adapters):

    python bench/zipf_residency.py --shape llama3-8b --device cuda --dtype bfloat16 \\
        --adapters 1000 --slots 128 --rank 8 --targets q_proj v_proj --rate 16 \\
        --duration-s 60 --prompt-min 64 --prompt-max 512 --output-min 64 --output-max 128 \\
        --max-num-seqs 128 --max-batched-tokens 4096 --kv-blocks 8192 --prefetch 32 \\
        --out $OUT/zipf
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.artifacts import ArtifactFetcher
from agent.catalog import AgentCatalog, Generation, ModelRef, ServingError, parse_desired_state
from agent.event_ledger import Event as LedgerEvent
from agent.metrics import AgentMetrics
from agent.serving import EngineLoop
from agent.tickets import Event, Ticket
from bench.synthetic import (
    ALL_LINEAR,
    BLOCK_SIZE,
    SHAPES,
    add_serving_args,
    percentile,
    pool_pages,
    random_base,
    save_results,
    write_checkpoint,
)
from bench.tenant_serving import Offer, warm_up
from dataplane.artifacts import (
    ArtifactLimits,
    BaseModelABI,
    ValidatedArtifact,
    read_base_abi,
    validate_peft_dir,
)
from dataplane.core import SamplingParams
from dataplane.engine import BaseModel, Engine, EngineSpec, RequestOutput, build_engine
from dataplane.engine.adapters import load_peft_adapter
from dataplane.engine.builder import DTYPES
from dataplane.models import ModelConfig

PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
          "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
"""The HF module each projection sits in (its PEFT key's path)."""
FILES = ("adapter_config.json", "adapter_model.safetensors")
STATUS_SAMPLE_S = 0.002


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


# ----- assets: base, adapters, catalog ----------------------------------------------------
def base_with_abi(args: argparse.Namespace, work: Path) -> BaseModel:
    """A random base of `--shape` with the ABI of its own weights: written as a checkpoint,
    read by `read_base_abi` (headers + streamed sha256), the checkpoint deleted again."""
    base = random_base(SHAPES[args.shape], DTYPES[args.dtype], args.device, seed=args.seed,
                       tag="zipf-residency")
    directory = write_checkpoint(base.model, SHAPES[args.shape], work / "base")
    abi = read_base_abi(directory)
    shutil.rmtree(directory)
    return BaseModel(base.model, abi.h_base, abi)


def write_peft(config: ModelConfig, dest: Path, seed: int, rank: int, targets: list[str],
               dtype: torch.dtype, device: str) -> Path:
    """A PEFT LoRA directory: rank-`rank` random factors (A [r, d_in], B [d_out, r], drawn
    on `device` from `seed`) on `targets` of every layer, lora_alpha = 2 r."""
    from safetensors.torch import save_file

    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for name in targets:
            d_out, d_in = config.module_shapes[name]
            key = f"base_model.model.model.layers.{layer}.{PARENT[name]}.{name}"
            a = torch.randn(rank, d_in, generator=gen, device=device) / math.sqrt(d_in)
            b = torch.randn(d_out, rank, generator=gen, device=device) * 0.01
            tensors[f"{key}.lora_A.weight"] = a.to(dtype).cpu().contiguous()
            tensors[f"{key}.lora_B.weight"] = b.to(dtype).cpu().contiguous()
    dest.mkdir(parents=True, exist_ok=True)
    (dest / FILES[0]).write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "use_rslora": False,
         "target_modules": sorted(targets), "bias": "none", "lora_dropout": 0.0,
         "task_type": "CAUSAL_LM"}, indent=1))
    save_file(tensors, str(dest / FILES[1]))
    return dest


def wire_artifact(index: int, directory: Path, validated: ValidatedArtifact) -> dict[str, Any]:
    """The desired state's artifact for a validated PEFT directory (file:// URLs)."""
    files = {}
    for name in FILES:
        data = (directory / name).read_bytes()
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                       "url": (directory / name).as_uri()}
    return {"id": index + 1, "digest": validated.h_artifact, "files": files,
            "validated_record": validated.to_record()}


@dataclass(frozen=True)
class Published:
    """The adapters as the agent's catalog serves them: alias i = adapter i."""

    refs: list[ModelRef]
    digests: list[str]
    directories: list[Path]


def publish(args: argparse.Namespace, abi: BaseModelABI, config: ModelConfig, root: Path,
            catalog: AgentCatalog) -> Published:
    """Write and validate `--adapters` adapters, then apply one desired state publishing
    each under its own alias (the `--prefetch` most popular marked prefetch)."""
    limits = ArtifactLimits(max_rank=args.rank)

    def make(i: int) -> tuple[Path, ValidatedArtifact]:
        directory = write_peft(config, root / f"adapter-{i:05d}", 1000 + i, args.rank,
                               args.targets, DTYPES[args.dtype], args.device)
        return directory, validate_peft_dir(directory, abi, limits)

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        made = list(pool.map(make, range(args.adapters)))
    refs = [ModelRef(f"ns{i % args.tenants}", f"a{i:05d}") for i in range(args.adapters)]
    aliases = [{"namespace": ref.namespace, "alias": ref.alias, "current_generation": 1,
                "prefetch": i < args.prefetch,
                "generations": [{"generation": 1, "action": "publish",
                                 "artifact": wire_artifact(i, directory, validated)}]}
               for i, (ref, (directory, validated)) in enumerate(zip(refs, made, strict=True))]
    digests = [validated.h_artifact for _, validated in made]
    catalog.update(*parse_desired_state(
        {"version": 1, "agent_id": 1, "worker_epoch": 1, "aliases": aliases,
         "prefetch": digests[:args.prefetch]}))
    return Published(refs, digests, [directory for directory, _ in made])


# ----- workload ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    t: float
    """Seconds after the start."""
    adapter: int
    prompt: list[int]
    max_tokens: int


def zipf_arrivals(args: argparse.Namespace, vocab: int) -> list[Arrival]:
    """Poisson arrivals (module docstring); the adapters come from a stream of their own."""
    gen = torch.Generator().manual_seed(args.seed)
    pick = torch.Generator().manual_seed(args.seed + 1)
    weights = torch.arange(1, args.adapters + 1, dtype=torch.float64).pow(-args.zipf)
    out: list[Arrival] = []
    t = 0.0
    while args.requests is None or len(out) < args.requests:
        if math.isfinite(args.rate):
            t += float(torch.empty(1).exponential_(args.rate, generator=gen))
        if args.requests is None and t >= args.duration_s:
            break
        plen = int(torch.randint(args.prompt_min, args.prompt_max + 1, (1,), generator=gen))
        olen = int(torch.randint(args.output_min, args.output_max + 1, (1,), generator=gen))
        prompt = torch.randint(3, vocab, (plen,), generator=gen).tolist()
        out.append(Arrival(t, int(torch.multinomial(weights, 1, generator=pick)), prompt, olen))
    return out


# ----- what the sinks and the status show -------------------------------------------------
class Tracked:
    """One request's sink (called on the loop thread, never blocking): its first output,
    finish or error, and the ledger's queue wait of it once it finished."""

    def __init__(self, loop: EngineLoop, adapter: int, done: Callable[[], None]) -> None:
        self.loop, self.adapter, self._done = loop, adapter, done
        self.ticket: Ticket | None = None
        self.first_token: float | None = None
        self.finished: float | None = None
        self.tokens = 0
        self.queue_wait: float | None = None
        self.error: str | None = None

    @property
    def residency(self) -> str:
        """`hit` or `cold` (the ticket's residency at admission); `none` if never queued."""
        seen = self.ticket.residency if self.ticket is not None else "base"
        return {"resident": "hit", "cold": "cold"}.get(seen, "none")

    def __call__(self, event: Event) -> None:
        now = time.monotonic()
        if isinstance(event, ServingError):
            self.error = event.code
            self._done()
            return
        out: RequestOutput = event
        self.tokens += len(out.new_token_ids)
        if self.first_token is None:
            self.first_token = now
        if out.finished:
            self.finished = now
            # the loop appended this request's queue wait just before calling its sink
            for rid, wait in reversed(self.loop.events.queue_waits):
                if rid == out.request_id:
                    self.queue_wait = wait
                    break
            self._done()


class StatusWatch:
    """Each adapter's waits for its load, and the adapters in slots over time (their
    time-weighted mean), from the loop's published status (module docstring)."""

    def __init__(self) -> None:
        self.open: dict[str, float] = {}
        self.longest: dict[str, float] = {}
        self._seen: object = None
        self._in_slots = 0
        self._since: float | None = None
        self._slot_seconds = 0.0
        self._seconds = 0.0

    @property
    def slots_filled_mean(self) -> float | None:
        return self._slot_seconds / self._seconds if self._seconds else None

    def sample(self, status: dict[str, Any], now: float) -> None:
        if status is self._seen:
            return
        self._seen = status
        slots = status.get("slots", [])
        if self._since is not None:
            self._slot_seconds += self._in_slots * (now - self._since)
            self._seconds += now - self._since
        self._since, self._in_slots = now, sum(s["slot"] is not None for s in slots)
        waiting = {s["artifact_digest"] for s in slots
                   if s["state"] == "loading" and s["waiting"] > 0}
        for digest in waiting:
            self.open.setdefault(digest, now)
        for digest in set(self.open) - waiting:
            self._close(digest, now)

    def close(self, now: float) -> None:
        """End the last interval and every open wait at `now`."""
        self.sample({"slots": []}, now)

    def _close(self, digest: str, now: float) -> None:
        span = now - self.open.pop(digest)
        self.longest[digest] = max(self.longest.get(digest, 0.0), span)


# ----- the run ----------------------------------------------------------------------------
def build_engine_for(args: argparse.Namespace, base: BaseModel, sample: Path,
                     arrivals: list[Arrival]) -> Engine:
    """The agent's engine at the bench's sizes: `--slots` slots of `--rank`, the pool
    holding `--kv-blocks` KV blocks besides `--slots` adapters of `sample`'s shape; warmed
    up (untimed) on the first arrivals' prompts with `sample` pinned, then unloaded."""
    assert base.abi is not None
    shape = load_peft_adapter(sample, base.abi, args.rank)
    pages = pool_pages(base.model, [shape] * args.slots, args.kv_blocks)
    engine = build_engine(EngineSpec.of(
        base, dtype=args.dtype, device=args.device, max_slots=args.slots, max_rank=args.rank,
        num_kv_blocks=pages, block_size=BLOCK_SIZE, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching,
        host_tier_bytes=max(1, int(args.host_mib * (1 << 20)))))
    # untimed, before the loop owns the engine: compile what the run's steps launch
    handle = engine.register_loaded_adapter(shape)
    warm = [Offer(f"warm-{i}", 0.0, a.prompt, 2, handle, "")
            for i, a in enumerate(arrivals[:2 * args.max_num_seqs])]
    warm_up(engine, warm, args.device)
    engine.unregister_adapter(handle)
    return engine


def await_prefetch(loop: EngineLoop, count: int, timeout_s: float) -> None:
    """Until `count` prefetched adapters sit in slots (or `timeout_s` passed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        slots = loop.status.get("slots", [])
        if sum(s["prefetch"] and s["state"] != "loading" for s in slots) >= count:
            return
        time.sleep(0.01)
    log(f"prefetch: not all {count} adapters were placed within {timeout_s:g} s")


def serve(args: argparse.Namespace, loop: EngineLoop, published: Published,
          arrivals: list[Arrival]) -> tuple[list[Tracked], StatusWatch, float, float]:
    """Submit each arrival at its time, sample the loop's status, wait for every request
    to end; (records, the status watch, start, end) in monotonic seconds."""
    lock = threading.Lock()
    open_count = [0]

    def done() -> None:
        with lock:
            open_count[0] -= 1

    watch = StatusWatch()
    records: list[Tracked] = []
    start = time.monotonic()
    for i, arrival in enumerate(arrivals):
        while (now := time.monotonic()) < start + arrival.t:
            watch.sample(loop.status, now)
            time.sleep(min(STATUS_SAMPLE_S, start + arrival.t - now))
        gen: Generation = loop.catalog.resolve(published.refs[arrival.adapter])
        tracked = Tracked(loop, arrival.adapter, done)
        ticket = Ticket(f"zipf-{i}", arrival.prompt, SamplingParams(
            temperature=0.0, max_tokens=arrival.max_tokens, ignore_eos=True), gen, tracked,
            max_queue_s=args.max_queue_s)
        tracked.ticket = ticket
        with lock:
            open_count[0] += 1
        records.append(tracked)
        loop.submit(ticket)
    deadline = time.monotonic() + args.drain_s
    while open_count[0] > 0 and (now := time.monotonic()) < deadline:
        watch.sample(loop.status, now)
        time.sleep(STATUS_SAMPLE_S)
    end = time.monotonic()
    watch.close(end)
    return records, watch, start, end


def ms(values: list[float], q: float) -> float | None:
    return 1e3 * percentile(values, q) if values else None


def summarize(args: argparse.Namespace, loop: EngineLoop, metrics: AgentMetrics,
              published: Published, records: list[Tracked], watch: StatusWatch, start: float,
              end: float) -> dict[str, Any]:
    events = loop.events
    completed = [r for r in records if r.finished is not None]
    failed = [r for r in records if r.error is not None]
    codes: dict[str, int] = {}
    for r in failed:
        assert r.error is not None
        codes[r.error] = codes.get(r.error, 0) + 1
    last = max((r.finished for r in completed if r.finished is not None), default=end)
    tokens = sum(r.tokens for r in completed)
    ttft = {c: [r.first_token - r.ticket.created for r in completed
                if r.residency == c and r.first_token is not None and r.ticket is not None]
            for c in ("hit", "cold")}
    queue = {c: [r.queue_wait for r in completed if r.residency == c and r.queue_wait is not None]
             for c in ("hit", "cold")}
    all_waits = queue["hit"] + queue["cold"]
    index = {d: i for i, d in enumerate(published.digests)}
    starved = sorted(({"adapter": index.get(d, -1), "longest_load_wait_s": w}
                      for d, w in watch.longest.items() if w > args.starve_s),
                     key=lambda s: -s["longest_load_wait_s"])
    evictions = metrics.registry.get_sample_value("adapter_evictions_total") or 0.0
    host = loop.engine.pool.host
    failed_attempts = (metrics.registry.get_sample_value(
        "adapter_load_attempts_total", {"result": "failed"}) or 0.0)
    return {
        "adapters": args.adapters, "slots": args.slots, "zipf": args.zipf,
        "distinct_adapters_requested": len({r.adapter for r in records}),
        "requests_offered": len(records), "requests_completed": len(completed),
        "requests_failed": len(failed), "failures_by_code": codes,
        "requests_unfinished": len(records) - len(completed) - len(failed),
        "hit_requests": len(ttft["hit"]), "cold_requests": len(ttft["cold"]),
        "output_tokens": tokens, "seconds": last - start,
        "output_tok_s": tokens / (last - start) if last > start else None,
        "ttft_hit_p50_ms": ms(ttft["hit"], 50), "ttft_hit_p99_ms": ms(ttft["hit"], 99),
        "ttft_cold_p50_ms": ms(ttft["cold"], 50), "ttft_cold_p99_ms": ms(ttft["cold"], 99),
        "queue_wait_p50_ms": ms(all_waits, 50), "queue_wait_p99_ms": ms(all_waits, 99),
        "queue_wait_max_ms": 1e3 * max(all_waits) if all_waits else None,
        "queue_wait_hit_max_ms": 1e3 * max(queue["hit"]) if queue["hit"] else None,
        "queue_wait_cold_max_ms": 1e3 * max(queue["cold"]) if queue["cold"] else None,
        "lookups": {k.value: n for k, n in events.lookups.items()},
        "cache_hit_rate": events.cache_hit_rate(),
        "loads_started": events.counts[LedgerEvent.ADAPTER_LOAD_STARTED],
        "loads_published": events.counts[LedgerEvent.ADAPTER_GENERATION_PUBLISHED],
        "load_attempts_failed": int(failed_attempts), "evictions": int(evictions),
        "loads_per_s": events.counts[LedgerEvent.ADAPTER_GENERATION_PUBLISHED] / (last - start)
        if last > start else None,
        "host_tier_mib": args.host_mib, "host_images_packed": loop.engine.pool.images_packed,
        "host_evictions": host.evictions, "host_images": len(host),
        "prefetch_published": events.prefetch_published,
        "load_amplification": events.load_amplification(),
        "prefetch_precision": events.prefetch_precision(),
        "slots_filled_mean": watch.slots_filled_mean,
        "slots_filled_end": len(loop.residents.in_slots()),
        "adapters_waited_for_load": len(watch.longest),
        "longest_load_wait_s": max(watch.longest.values(), default=0.0),
        "starve_s": args.starve_s, "load_starved": starved,
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    base = base_with_abi(args, work)
    assert base.abi is not None
    log(f"random base and its ABI at {time.monotonic() - t0:.1f} s")
    config = base.model.config
    catalog = AgentCatalog()
    published = publish(args, base.abi, config, work / "adapters", catalog)
    log(f"{args.adapters} adapters written, validated and published at "
        f"{time.monotonic() - t0:.1f} s")
    arrivals = zipf_arrivals(args, config.vocab_size)
    engine = build_engine_for(args, base, published.directories[0], arrivals)
    log(f"engine built and warmed up at {time.monotonic() - t0:.1f} s")
    metrics = AgentMetrics()
    fetcher = ArtifactFetcher(work / "cache", base.abi, args.rank)
    loop = EngineLoop(engine, fetcher, catalog, metrics, args.slots, args.max_live,
                      load_attempts=args.load_attempts,
                      cold_reserve_after_s=args.cold_reserve_after_s)
    loop.start()
    try:
        loop.reconcile()  # placement's prefetch assignment, loaded before the clock starts
        await_prefetch(loop, min(args.prefetch, args.slots), timeout_s=120.0)
        log(f"{len(arrivals)} arrivals start at {time.monotonic() - t0:.1f} s")
        records, watch, start, end = serve(args, loop, published, arrivals)
    finally:
        loop.stop()
    log(f"served at {time.monotonic() - t0:.1f} s")
    engine.shutdown()
    return summarize(args, loop, metrics, published, records, watch, start, end)


# ----- command line -----------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_serving_args(p, kv_help="KV blocks besides the slots")
    p.add_argument("--adapters", type=int, default=None,
                   help="published adapters (default 1000 on cuda, 200 otherwise)")
    p.add_argument("--slots", type=int, default=128, help="adapter slots (engine and loop)")
    p.add_argument("--host-mib", type=float, default=1024.0,
                   help="the engine's host tier of packed adapter images (the agent's "
                   "host_tier_mib; fractions allowed)")
    p.add_argument("--rank", type=int, default=8, help="every adapter's rank (= max rank)")
    p.add_argument("--targets", nargs="+", default=["q_proj", "v_proj"], choices=ALL_LINEAR)
    p.add_argument("--tenants", type=int, default=4, help="namespaces; alias i in ns{i mod T}")
    p.add_argument("--prefetch", type=int, default=8,
                   help="most popular aliases marked prefetch (loaded before the start)")
    p.add_argument("--zipf", type=float, default=1.2, help="popularity exponent")
    p.add_argument("--rate", type=float, default=20.0, help="Poisson req/s (inf: all at once)")
    p.add_argument("--duration-s", type=float, default=10.0, help="arrivals' span")
    p.add_argument("--requests", type=int, default=None,
                   help="exactly this many arrivals instead of --duration-s")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="the engine without its prefix cache (the agent runs with it)")
    p.add_argument("--max-live", type=int, default=100_000,
                   help="the loop's live + waiting request limit (beyond it: 429)")
    p.add_argument("--max-queue-s", type=float, default=None,
                   help="every request's max_queue_ms, in seconds (default: none)")
    p.add_argument("--load-attempts", type=int, default=2)
    p.add_argument("--cold-reserve-after-s", type=float, default=0.2)
    p.add_argument("--starve-s", type=float, default=2.0,
                   help="a load wait longer than this is load-starved")
    p.add_argument("--drain-s", type=float, default=300.0,
                   help="longest wait for open requests after the last arrival")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None,
                   help="where the run's temporary directory (checkpoint, adapters, fetch "
                        "cache; removed at the end) is made (default: the system's)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.adapters is None:
        args.adapters = 1000 if str(args.device).startswith("cuda") else 200
    for name in ("adapters", "slots", "rank", "tenants", "max_num_seqs", "max_batched_tokens",
                 "kv_blocks", "max_live", "load_attempts", "requests", "prompt_min",
                 "output_min"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.prefetch < 0:
        p.error("--prefetch must be >= 0")
    for name in ("rate", "duration_s", "starve_s", "drain_s", "zipf"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.max_queue_s is not None and not args.max_queue_s > 0:
        p.error("--max-queue-s must be > 0")
    if args.cold_reserve_after_s < 0:
        p.error("--cold-reserve-after-s must be >= 0")
    if args.requests is None and not math.isfinite(args.rate):
        p.error("--rate inf needs --requests")
    if args.prompt_max < args.prompt_min or args.output_max < args.output_min:
        p.error("--prompt-max / --output-max must be >= their minimum")
    return args


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # a fresh directory every run: the fetch cache starts empty (first uses download)
    with tempfile.TemporaryDirectory(prefix="zipf-residency-", dir=args.workdir) as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=1))
    save_results(args.out, "zipf_residency.json", args, result)


if __name__ == "__main__":
    main()
