"""Tenants' requests served on one engine, timed: what the scenarios of bench/fairness.py share.

* `build_pinned`: an engine under one scheduling policy on a random base of its own (one
  model serves one engine), every adapter pinned in its unified pool; `free_device_memory`
  once one is dropped;
* request streams: `tenant_trace` (request i on adapter i mod N, lengths drawn as
  `make_trace` draws them), `ramp_times` (Poisson arrivals at a linearly rising rate),
  `offers` (a trace as requests to add: request i of tenant `ns{i mod T}`);
* `serve`: requests added at their arrival time (open loop) or whenever fewer than
  `concurrency` are live (closed loop), the engine stepped until every one has finished;
  returns each request's `Fate` and the engine's admission counts over the run;
* `warm_up`: the offers served once untimed (prompts reversed, 2 tokens each);
* `closed_loop_capacity`: the requests per second an engine completes while full.
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from bench.synthetic import (
    BLOCK_SIZE,
    SHAPES,
    Request,
    make_trace,
    pool_pages,
    random_base,
    sync,
)
from dataplane.core import SamplingParams
from dataplane.engine import Engine, EngineSpec, build_engine
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.builder import DTYPES


def build_pinned(args: argparse.Namespace, policy: str, adapters: list[LoadedAdapter]
                 ) -> tuple[Engine, list[AdapterHandle]]:
    """An engine of `--shape` / `--dtype` / `--device` and the bench's sizes under `policy`
    (prefix caching off: repeated prompts cost the same every time), its pool holding
    `--kv-blocks` KV blocks plus `adapters`, each pinned; their handles in order."""
    base = random_base(SHAPES[args.shape], DTYPES[args.dtype], args.device, seed=args.seed)
    engine = build_engine(EngineSpec.of(
        base, dtype=args.dtype, device=args.device, max_slots=len(adapters), max_rank=16,
        num_kv_blocks=pool_pages(base.model, adapters, args.kv_blocks),
        block_size=BLOCK_SIZE, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens, scheduling_policy=policy,
        enable_prefix_caching=False))
    return engine, [engine.register_loaded_adapter(a) for a in adapters]


def free_device_memory() -> None:
    """Give the device memory of engines no longer referenced back before the next is built
    (an engine's parts refer to each other: only the cycle collector frees them)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def tenant_trace(args: argparse.Namespace, vocab: int, n: int,
                 arrivals: list[float] | None = None) -> list[Request]:
    """`n` requests, prompt and output lengths drawn as `make_trace` draws them (`--prompt-*`,
    `--output-*`, `--seed`), request i on adapter i mod `--trace-adapters`; arriving at
    `arrivals` (seconds from the start), or by `make_trace`'s `--rate` when None."""
    shaped = make_trace(argparse.Namespace(**{**vars(args), "requests": n}), vocab, 0)
    return [replace(r, adapter=i % args.trace_adapters,
                    arrival=r.arrival if arrivals is None else arrivals[i])
            for i, r in enumerate(shaped)]


def ramp_times(rate_from: float, rate_to: float, duration: float, seed: int) -> list[float]:
    """Poisson arrival times over [0, `duration`) whose rate rises (or falls) linearly from
    `rate_from` to `rate_to` requests per second (both > 0): the k-th unit-rate arrival S_k
    mapped through the inverse of the cumulative rate, a t + b t^2 / 2 = S_k."""
    a, b = rate_from, (rate_to - rate_from) / duration
    gen = torch.Generator().manual_seed(seed)
    out: list[float] = []
    s = 0.0
    while True:
        s += float(torch.empty(1).exponential_(1.0, generator=gen))
        disc = a * a + 2 * b * s
        if disc < 0:  # a falling rate whose whole mass is spent
            return out
        t = 2 * s / (a + math.sqrt(disc))  # the root of a t + b t^2 / 2 = s, stable at b = 0
        if t >= duration:
            return out
        out.append(t)


@dataclass(frozen=True)
class Offer:
    """A request to add `t` seconds after the start (closed loop: once a place is free)."""

    rid: str
    t: float
    prompt: list[int]
    max_tokens: int
    adapter: AdapterHandle
    tenant: str
    max_queue_s: float | None = None


def offers(trace: list[Request], handles: list[AdapterHandle], tenants: int, label: str,
           max_queue_s: float | None = None) -> list[Offer]:
    """`trace` as offers `label-i`: request i of tenant `ns{i mod tenants}` (equal weights:
    the engine's default), on its adapter's handle, with queue deadline `max_queue_s`."""
    return [Offer(f"{label}-{i}", r.arrival, r.prompt, r.max_tokens,
                  handles[r.adapter or 0], f"ns{i % tenants}", max_queue_s)
            for i, r in enumerate(trace)]


@dataclass
class Fate:
    """One request's run: perf_counter seconds of its arrival (open loop: the scheduled
    time; closed loop: when it was added), first token and finish; why it finished."""

    tenant: str
    arrival: float
    first_token: float | None = None
    finished: float | None = None
    finish_reason: str | None = None
    tokens: int = 0


@dataclass
class Served:
    """Every offered request's fate, the run's wall seconds (first arrival possible to last
    finish), its engine steps, and `Engine.admission_counts()` gained over the run."""

    fates: dict[str, Fate]
    seconds: float
    steps: int
    counts: dict[str, int]

    @property
    def tokens(self) -> int:
        return sum(f.tokens for f in self.fates.values())

    def met(self) -> list[Fate]:
        """The requests that met their queue deadline: finished, not by "deadline"."""
        return [f for f in self.fates.values()
                if f.finished is not None and f.finish_reason != "deadline"]

    def ttfts(self, fates: list[Fate] | None = None) -> list[float]:
        """Seconds from arrival to first token of `fates` (default: all) that got one."""
        chosen = self.fates.values() if fates is None else fates
        return [f.first_token - f.arrival for f in chosen if f.first_token is not None]


class StepWatch(Protocol):
    """Looks at the engine around each step `serve` takes."""

    def before_step(self, engine: Engine) -> None: ...

    def after_step(self, engine: Engine) -> None: ...


def serve(engine: Engine, todo: list[Offer], *, concurrency: int | None = None,
          watch: StepWatch | None = None) -> Served:
    """Add each offer once its time has come (and, with `concurrency`, while fewer than that
    many of them are live), step the engine until all have finished. Greedy, EOS ignored:
    a request that starts produces exactly its `max_tokens` tokens."""
    fates: dict[str, Fate] = {}
    pending = deque(sorted(todo, key=lambda o: o.t))
    counts = engine.admission_counts()
    live = steps = 0
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0].t <= now and (concurrency is None or live < concurrency):
            o = pending.popleft()
            engine.add_request(o.rid, o.prompt, SamplingParams(
                temperature=0.0, max_tokens=o.max_tokens, ignore_eos=True), o.adapter,
                tenant=o.tenant, max_queue_s=o.max_queue_s)
            fates[o.rid] = Fate(o.tenant, time.perf_counter() if concurrency is not None
                                  else start + o.t)
            live += 1
        if not engine.has_unfinished():
            time.sleep(min(0.001, max(0.0, pending[0].t - now)))
            continue
        if watch is not None:
            watch.before_step(engine)
        outs = engine.step()
        stamp = time.perf_counter()
        steps += 1
        if watch is not None:
            watch.after_step(engine)
        for out in outs:
            fate = fates[out.request_id]
            fate.tokens += len(out.new_token_ids)
            if out.new_token_ids and fate.first_token is None:
                fate.first_token = stamp
            if out.finished:
                fate.finished, fate.finish_reason = stamp, out.finish_reason
                live -= 1
    seconds = time.perf_counter() - start
    after = engine.admission_counts()
    return Served(fates, seconds, steps, {k: after[k] - counts.get(k, 0) for k in after})


def warm_up(engine: Engine, todo: list[Offer], device: str) -> None:
    """Untimed: every offer at once, its prompt reversed (same lengths and adapters) and 2
    output tokens, so that the kernel variants its steps launch (prefill lengths, chunked
    and mixed steps) are compiled before a clock starts (as bench/trace_run.py warms up)."""
    serve(engine, [replace(o, rid=f"warm-up-{o.rid}", t=0.0, prompt=o.prompt[::-1],
                           max_tokens=2, max_queue_s=None) for o in todo])
    sync(device)


def closed_loop_capacity(engine: Engine, todo: list[Offer], concurrency: int,
                         timed: int) -> float:
    """Requests per second `engine` completes with `concurrency` requests live at all times:
    `todo` (at least `timed` + 2 x `concurrency` offers) served closed-loop, timed from its
    `concurrency`-th completion over the next `timed` (neither the fill nor the drain)."""
    if len(todo) < timed + 2 * concurrency:
        raise ValueError("closed_loop_capacity needs timed + 2 x concurrency offers")
    ends = sorted(f.finished for f in serve(engine, todo, concurrency=concurrency).fates.values()
                  if f.finished is not None)
    return timed / (ends[concurrency + timed - 1] - ends[concurrency - 1])
