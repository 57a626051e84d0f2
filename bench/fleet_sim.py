"""Fleet routing, simulated: a discrete-event model of agents behind routers (no GPU, no network).

Every policy serves the same trace on the same fleet model; only the choice of agent
differs. The product policy is `agent.router.routing.route` itself, called per request
exactly as a router calls it: `AgentView`s built from the routing table (each agent's
last heartbeat, as the router's last table refresh saw it) and the router's own
`LocalView` (its requests in flight per agent, the `sent_cold` marks it set).

**Fleet.** `--agents` agents, one base, every adapter feasible on every agent. Each agent
is one engine with:

* `--slots` adapter slots. An adapter is resident once loaded; a request for an adapter
  that is neither resident nor loading starts a cold load. Loads run on 2 loader threads
  (`agent/serving.py`: `ThreadPoolExecutor(max_workers=2)`); a load takes a slot when it
  starts, evicting the least recently used idle adapter (no request on the agent names
  it); with no idle adapter it waits for one. Requests for a loading adapter wait for it.
* continuous batching: each step admits waiting requests (resident adapters, arrival
  order) up to 128 running, runs one decode row per running request and chunked prefill
  of admitted prompts in what is left of the 4,096-token budget. A request's first
  token comes at the end of the step that finishes its prompt; it then takes
  `output - 1` more steps. The step time is the model below.
* admission control: an agent with `max_queued_requests` (256, the agent's default)
  requests on it answers 429, and the router tries the next agent of its order, up to
  `max_attempts` (3, the router's default) agents; a request refused by all is rejected.
* a heartbeat every `--heartbeat-s` (2 s, the agent's `heartbeat_interval_s`; phases
  random): resident digests (loading included) and load (requests admitted + waiting
  for a load), the `RouteAgent` fields the control plane serves. Each router refreshes
  its table every `--refresh-s` (0.5 s, `RouterSettings.refresh_s`). Placement's
  prefetch (and its replicas from request rates) is not modelled: a table entry lists
  what the agent's slots hold, and where a second copy loads is the router's choice.

**Step time** (ms), from docs/PERFORMANCE.md (Llama-3-8B shape, bf16, one H200):

* `step = 1.2 x (4.86 + 0.01766 x decode_rows + 0.02223 x prefill_tokens + LoRA)`.
  Decode rows: "Engine", decode step at B = 64, no LoRA, 5.99 ms, and "Engine", single
  runs, decode step p50 at 128 seqs, no LoRA, 7.12 ms: (7.12 - 5.99) / 64 per row,
  5.99 - 64 x that fixed. Prefill: "Tensor parallel", TP = 1 prefill of 4,096 rows,
  95.9 ms at the low (no-LoRA) end of its range: (95.9 - 4.86) / 4,096 per token (this
  gives 17.37 ms for that table's 576-row mixed step, measured 17.14).
* LoRA, decode-only steps (the fold): "Unified pool and the LoRA fold", engine.step():
  +0.96 ms with 16 distinct adapters (7.18 - 6.22), +1.37 with 64 (7.59 - 6.22); linear
  from 0 to 16, from 16 to 64, and on beyond 64.
* LoRA, steps with prefill (launched): "Tensor parallel", TP = 1 mixed 576 rows
  piecewise: +3.38 ms with 16 adapters (20.52 - 17.14), +4.23 with 128 (64 distinct per
  step; 21.37 - 17.14), interpolated the same way by distinct adapters in the step, plus
  0.0011 ms per row above 576 (ASSUMPTION: the 4,096-row prefill range 95.9-104.0 ms read
  as no LoRA -> 128 adapters: (8.1 - 4.23) / (4,096 - 576)).
* the 1.2 (`--step-scale`, CALIBRATION): the sum of these per-kernel costs serves the
  "Engine" trace (256 requests at t = 0 on 128 Zipf(1.0) adapters, prompts 64-512,
  outputs 64-128, 128 seqs / 4,096 tokens) at 6,570 output tok/s in this model against
  5,187-5,703 measured: it leaves out host enqueue and scheduling gaps ("Engine": 5.2-5.8
  ms of host enqueue per mixed step). Scaled, the model serves it at 5,475 tok/s (the
  header prints both this and one saturated agent's rate).
* cold load: 307 ms (`--cold-load-ms`): "Adapter residency under a Zipf workload", TTFT
  p50 of a request that waited for its load minus one on a resident adapter, 358 - 51
  ms, through the agent's real load path (download to a fresh cache, digest check,
  validation, copy, publish). The pool path alone from the verified host tier is 2.138
  ms ("Cold adapter loads"): `--cold-load-ms 2.1` models a fleet where every adapter is
  already in every agent's host tier. ASSUMPTION: loads never slow steps (the copy runs
  on a side stream).
* agent shape: 128 slots, 128 seqs, 4,096-token steps, 8,192 KV blocks of 16 tokens
  (the configurations of "Engine" and "Adapter residency under a Zipf workload").

**Workload.** `--adapters` adapters, Zipf(`--zipf`) popularity (rank k has weight
(k + 1)^-s; ranks are a seeded random permutation of the adapters, so popular digests
are random points on the hash ring); prompts uniform in 64-512 tokens, outputs 64-128
(the "Engine" trace's). Arrivals are on/off bursts (a two-state Markov-modulated Poisson
process with fixed sojourns): `--calm-s` (8 s) calm, then `--burst-s` (2 s) at
`--burst-mult` (1.5) x the mean rate, Poisson within each; the calm rate makes the
cycle's mean the mean rate, and the default warm-up and window are whole cycles. The
mean rate is `--load` (0.65) x the fleet's saturated request rate (agents x one
saturated agent's, from this model), unless `--rate` gives it in req/s; a burst takes
the fleet to 0.98 of capacity. `--routers N` spreads requests uniformly over N routers,
each with its own LocalView and refresh phase. Requests arriving in the first
`--warmup-s` (30 s: the slots fill) are not measured; those of the next `--duration-s`
(60 s) are; the run ends when every request has finished.

**Policies.**

* `round-robin`: each router cycles over the agents.
* `least-loaded`: fewest requests this router has in flight there (exact, local;
  residency ignored).
* `product`: `agent.router.routing.route` (`--load-factor`: its bound). Marks as the
  router server does: on each attempt at an agent whose table entry does not list the
  adapter, `sent_cold.setdefault(digest, (agent, now + cold_mark_s))` (30 s,
  `RouterSettings.cold_mark_s`); a mark lapses after that (route drops it).
* `oracle`: the same agents (the same LRU slots and loaders) behind a router that knows
  the whole trace and every agent's exact state now. From the trace, each adapter gets
  r = max(1, ceil(its requests / (all requests / agents))) home agents (no replica
  carries more than one agent's fair share), assigned heaviest first, each to the agent
  with the least requests assigned so far (longest processing time first: within 4/3
  of the best balance); each agent starts with the heaviest of its assignment resident.
  A request goes to the least loaded agent (exact requests on it) that holds its
  adapter now, unless that one has more than `delta` requests more than the least
  loaded agent, where `delta` = the requests one agent serves while one cold load runs
  (cold load x one agent's saturated req/s): then to its least loaded home if that is
  within `delta`, else to the least loaded agent, which loads it. So it trades a cold
  load against queueing at their actual exchange rate, with no stale or partial
  information and with replicas sized to future demand; it is what the router's
  information limits cost, not a proven optimum (the agents' LRU is the same for all).

**Reported** per policy over the measured window: cold loads/s (loads started),
load amplification (loads / distinct adapters requested), TTFT p50 / p99 (arrival at the
router to the first token; router and network add nothing; rejected requests are not in
the percentiles), rejected requests, mean and max agent utilisation (output tokens
served / one saturated agent's), and the targets' ratios: least-loaded's cold loads /
product's (target >= 5, with product p99 TTFT <= least-loaded's) and product p99 TTFT /
oracle's (target <= 1.5).

Deterministic for a given `--seed` (the trace and every tie). The default scenario (64
agents, 10,000 adapters, 30 + 60 s) takes about a minute on two cores (`--jobs 2`: the
policies in parallel processes).

    python bench/fleet_sim.py --zipf 1.0
    python bench/fleet_sim.py --zipf 1.2 --cold-load-ms 2.1 --routers 4 --json
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import json
import math
import os
import random
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent.router.routing  # the product policy, called as the router calls it
from agent.router.routing import LOAD_FACTOR, AgentView, LocalView, Target

POLICIES = ("round-robin", "least-loaded", "product", "oracle")
BASE = "h_base"
ROLES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                   "down_proj"})
RANK = 16
LEASE_S = 10.0
"""The control plane's lease (controlplane/fleet/service.py LEASE_S)."""
MAX_QUEUED = 256
"""AgentSettings.max_queued_requests: 429 at this many requests on an agent."""
MAX_ATTEMPTS = 3
"""RouterSettings.max_attempts."""
COLD_MARK_S = 30.0
"""RouterSettings.cold_mark_s."""
LOADERS = 2
"""Loader threads per agent (agent/serving.py)."""


@dataclass(frozen=True)
class EngineModel:
    """Step and load times in ms (module docstring: where each comes from)."""

    step_base_ms: float = 4.86
    decode_row_ms: float = 0.01766
    prefill_token_ms: float = 0.02223
    fold_16_ms: float = 0.96
    fold_64_ms: float = 1.37
    mixed_16_ms: float = 3.38
    mixed_64_ms: float = 4.23
    mixed_row_ms: float = 0.0011
    mixed_rows_ref: int = 576
    step_scale: float = 1.2
    """Calibration: every step x this, so one agent serves the "Engine" trace at the
    measured rate (module docstring)."""
    cold_load_ms: float = 307.0
    slots: int = 128
    max_num_seqs: int = 128
    max_batched_tokens: int = 4096
    kv_blocks: int = 8192
    block_size: int = 16

    def lora_ms(self, distinct: int, with_prefill: bool) -> float:
        a16, a64 = ((self.mixed_16_ms, self.mixed_64_ms) if with_prefill
                    else (self.fold_16_ms, self.fold_64_ms))
        if distinct <= 16:
            return a16 * distinct / 16
        return a16 + (a64 - a16) * (distinct - 16) / 48

    def step_ms(self, decode_rows: int, prefill_tokens: int, distinct: int) -> float:
        t = (self.step_base_ms + self.decode_row_ms * decode_rows
             + self.prefill_token_ms * prefill_tokens)
        if distinct:
            t += self.lora_ms(distinct, prefill_tokens > 0)
            if prefill_tokens:
                t += self.mixed_row_ms * max(0, decode_rows + prefill_tokens
                                             - self.mixed_rows_ref)
        return t * self.step_scale


@dataclass(frozen=True)
class Scenario:
    agents: int = 64
    adapters: int = 10_000
    zipf: float = 1.0
    rate: float = 0.0
    """Mean req/s; 0: `load` x the fleet's saturated rate."""
    load: float = 0.65
    warmup_s: float = 30.0
    duration_s: float = 60.0
    seed: int = 0
    routers: int = 1
    heartbeat_s: float = 2.0
    refresh_s: float = 0.5
    calm_s: float = 8.0
    burst_s: float = 2.0
    burst_mult: float = 1.5
    prompt_min: int = 64
    prompt_max: int = 512
    output_min: int = 64
    output_max: int = 128


@dataclass
class Trace:
    arrive: list[float]
    adapter: list[int]
    prompt: list[int]
    output: list[int]
    router: list[int]
    bursts: list[tuple[float, float]]


def make_trace(sc: Scenario, rate: float) -> Trace:
    """The MMPP arrivals with Zipf adapters (module docstring), from `sc.seed` alone."""
    rng = random.Random(f"trace-{sc.seed}")
    perm = list(range(sc.adapters))
    rng.shuffle(perm)
    cum: list[float] = []
    total = 0.0
    for k in range(sc.adapters):
        total += (k + 1) ** -sc.zipf
        cum.append(total)
    calm_mult = (sc.calm_s + sc.burst_s - sc.burst_mult * sc.burst_s) / sc.calm_s
    end = sc.warmup_s + sc.duration_s
    arrive: list[float] = []
    adapter: list[int] = []
    bursts: list[tuple[float, float]] = []
    t, burst = 0.0, False
    while t < end:
        seg = min(end, t + (sc.burst_s if burst else sc.calm_s))
        lam = rate * (sc.burst_mult if burst else calm_mult)
        if burst:
            bursts.append((t, seg))
        x = t + rng.expovariate(lam)
        while x < seg:
            arrive.append(x)
            adapter.append(perm[min(bisect.bisect_left(cum, rng.random() * total),
                                    sc.adapters - 1)])
            x += rng.expovariate(lam)
        t, burst = seg, not burst
    n = len(arrive)
    prompt = [rng.randint(sc.prompt_min, sc.prompt_max) for _ in range(n)]
    output = [rng.randint(sc.output_min, sc.output_max) for _ in range(n)]
    router = [rng.randrange(sc.routers) for _ in range(n)] if sc.routers > 1 else [0] * n
    return Trace(arrive, adapter, prompt, output, router, bursts)


class Agent:
    __slots__ = ("batch", "blocked", "busy", "busy_ms", "evictions", "finish", "idx",
                 "kv_used", "load_queue", "loaders_busy", "n_admitted", "n_decoding",
                 "pending", "prefillq", "ref", "slots", "step_no", "tokens",
                 "total", "waitq")

    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.slots: OrderedDict[int, None] = OrderedDict()
        """Resident adapters, least recently used first."""
        self.blocked: dict[int, list[int]] = {}
        """Adapter being loaded (or queued for a loader) -> requests waiting for it."""
        self.load_queue: deque[int] = deque()
        self.loaders_busy = 0
        self.ref: dict[int, int] = {}
        """Adapter -> requests on this agent naming it (absent: idle)."""
        self.waitq: deque[int] = deque()
        self.prefillq: deque[list[int]] = deque()
        """[request, prompt tokens left] of admitted requests still in prefill."""
        self.batch: dict[int, int] = {}
        """Adapter -> admitted requests (the step's distinct adapters are its keys)."""
        self.finish: list[tuple[int, int]] = []
        self.pending: list[int] = []
        self.n_admitted = 0
        self.n_decoding = 0
        self.total = 0
        self.kv_used = 0
        self.busy = False
        self.step_no = 0
        self.busy_ms = 0.0
        self.tokens = 0
        self.evictions = 0


class Router:
    __slots__ = ("idx", "local", "rr", "view_by_id", "views")

    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.local = LocalView()
        self.views: list[AgentView] = []
        self.view_by_id: dict[int, AgentView] = {}
        self.rr = idx


@dataclass
class Result:
    policy: str
    requests: int
    completed: int
    rejected: int
    retries: int
    cold_loads: int
    cold_loads_per_s: float
    distinct_adapters: int
    amplification: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    ttft_cold_p99_ms: float
    utilisation_mean: float
    utilisation_max: float
    busy_fraction_mean: float
    evictions: int
    total_loads: int
    total_distinct: int
    total_completed: int
    total_requests: int
    wall_s: float


ARRIVAL, STEP_END, LOAD_DONE, HEARTBEAT, REFRESH = range(5)


class Sim:
    """One policy over one trace (module docstring)."""

    def __init__(self, sc: Scenario, model: EngineModel, trace: Trace, policy: str,
                 preload: Sequence[Sequence[int]] | None = None,
                 max_queued: int = MAX_QUEUED, load_factor: float = LOAD_FACTOR,
                 sat_req_s: float = 0.0) -> None:
        self.sc, self.m, self.tr, self.policy = sc, model, trace, policy
        self.max_queued = max_queued
        self.load_factor = load_factor
        self.delta = model.cold_load_ms / 1000.0 * sat_req_s
        """Oracle: requests one agent serves while one cold load runs."""
        self.agents = [Agent(i) for i in range(sc.agents)]
        self.routers = [Router(i) for i in range(sc.routers)]
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        n = len(trace.arrive)
        self.first_t = [-1.0] * n
        self.done_t = [-1.0] * n
        self.agent_of = [-1] * n
        self.cold = [False] * n
        self.rejected = [False] * n
        self.open = 0
        self.retries = 0
        self.load_log: list[tuple[float, int]] = []
        self.t0 = sc.warmup_s
        self.t1 = sc.warmup_s + sc.duration_s
        self.digests = [hashlib.sha256(f"adapter-{i}".encode()).hexdigest()
                        for i in range(sc.adapters)]
        self.targets = [Target(base=BASE, digest=d, rank=RANK, roles=ROLES)
                        for d in self.digests]
        self.snap: list[tuple[float, frozenset[str], int, int]] = [
            (0.0, frozenset(), 0, model.kv_blocks) for _ in self.agents]
        self.homes: list[tuple[int, ...]] = []
        if policy == "oracle":
            self.homes = oracle_homes(sc, model, trace, self.agents)
        if preload is not None:
            for ag, adapters in zip(self.agents, preload, strict=True):
                for a in adapters:
                    ag.slots[a] = None
        rng = random.Random(f"phases-{sc.seed}")
        for ag in self.agents:
            self.push(rng.random() * sc.heartbeat_s, HEARTBEAT, ag.idx, 0)
        for rt in self.routers:
            self.refresh(rt, 0.0)
            self.push(rng.random() * sc.refresh_s, REFRESH, rt.idx, 0)
        self.order: Callable[[Router, int, float], Sequence[int]] = {
            "round-robin": self.order_rr, "least-loaded": self.order_ll,
            "product": self.order_product, "oracle": self.order_oracle,
            "single": lambda rt, r, now: (0,)}[policy]

    def push(self, t: float, kind: int, a: int, b: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    # ----- the loop ------------------------------------------------------------------
    def run(self) -> None:
        arrive = self.tr.arrive
        n = len(arrive)
        events = self.events
        i = 0
        inf = math.inf
        while i < n or self.open:
            ta = arrive[i] if i < n else inf
            if events and events[0][0] <= ta:
                t, _, kind, a, b = heapq.heappop(events)
                if kind == STEP_END:
                    self.step_end(self.agents[a], t)
                elif kind == LOAD_DONE:
                    self.load_done(self.agents[a], b, t)
                elif kind == HEARTBEAT:
                    self.heartbeat(self.agents[a], t)
                    self.push(t + self.sc.heartbeat_s, HEARTBEAT, a, 0)
                else:
                    self.refresh(self.routers[a], t)
                    self.push(t + self.sc.refresh_s, REFRESH, a, 0)
            else:
                self.dispatch(i, ta)
                i += 1

    def dispatch(self, r: int, now: float) -> None:
        rt = self.routers[self.tr.router[r]]
        for aid in self.order(rt, r, now)[:MAX_ATTEMPTS]:
            ag = self.agents[aid]
            if self.policy == "product":
                self.mark(rt, r, aid, now)
            if ag.total >= self.max_queued:
                self.retries += 1
                continue
            self.open += 1
            self.agent_of[r] = aid
            inflight = rt.local.inflight
            inflight[aid] = inflight.get(aid, 0) + 1
            self.enqueue(ag, r, now)
            return
        self.rejected[r] = True

    # ----- policies ------------------------------------------------------------------
    def order_rr(self, rt: Router, r: int, now: float) -> Sequence[int]:
        n = self.sc.agents
        start = rt.rr
        rt.rr = (start + 1) % n
        return [(start + k) % n for k in range(min(MAX_ATTEMPTS, n))]

    def order_ll(self, rt: Router, r: int, now: float) -> Sequence[int]:
        inflight = rt.local.inflight
        return heapq.nsmallest(MAX_ATTEMPTS, range(self.sc.agents),
                               key=lambda i: (inflight.get(i, 0), i))

    def order_product(self, rt: Router, r: int, now: float) -> Sequence[int]:
        order = agent.router.routing.route(self.targets[self.tr.adapter[r]], rt.views,
                                           rt.local, now, LEASE_S, self.load_factor)
        return [v.agent_id for v in order]

    def order_oracle(self, rt: Router, r: int, now: float) -> Sequence[int]:
        agents = self.agents
        a = self.tr.adapter[r]
        by_load = sorted(range(self.sc.agents), key=lambda i: (agents[i].total, i))
        holders = [i for i in by_load if a in agents[i].slots or a in agents[i].blocked]
        if not holders or agents[holders[0]].total - agents[by_load[0]].total > self.delta:
            home = min(self.homes[a], key=lambda i: (agents[i].total, i))
            first = home if agents[home].total - agents[by_load[0]].total <= self.delta \
                else by_load[0]
            return [first] + [i for i in by_load if i != first]
        return holders + [i for i in by_load if i not in holders]

    def mark(self, rt: Router, r: int, aid: int, now: float) -> None:
        """The router server's cold mark (agent/router/server.py): on each attempt at an
        agent whose table entry does not list the adapter, unless a mark is set."""
        digest = self.digests[self.tr.adapter[r]]
        view = rt.view_by_id.get(aid)
        if view is None or digest not in view.resident:
            rt.local.sent_cold.setdefault(digest, (aid, now + COLD_MARK_S))

    # ----- heartbeats and the routing table ------------------------------------------
    def heartbeat(self, ag: Agent, now: float) -> None:
        d = self.digests
        resident = frozenset([d[a] for a in ag.slots] + [d[a] for a in ag.blocked])
        self.snap[ag.idx] = (now, resident, ag.total, self.m.kv_blocks - ag.kv_used)

    def refresh(self, rt: Router, now: float) -> None:
        if self.policy != "product":
            return
        rt.views = [AgentView(agent_id=i, base=BASE, max_rank=RANK, targets=ROLES,
                              resident=res, reported_load=load, heartbeat_age_s=now - t,
                              free_pages=free)
                    for i, (t, res, load, free) in enumerate(self.snap)]
        rt.view_by_id = {v.agent_id: v for v in rt.views}

    # ----- an agent ------------------------------------------------------------------
    def enqueue(self, ag: Agent, r: int, now: float) -> None:
        a = self.tr.adapter[r]
        ag.total += 1
        ag.ref[a] = ag.ref.get(a, 0) + 1
        if a in ag.slots:
            ag.slots.move_to_end(a)
            ag.waitq.append(r)
            if not ag.busy:
                self.start_step(ag, now)
        elif a in ag.blocked:
            ag.blocked[a].append(r)
            self.cold[r] = True
        else:
            ag.blocked[a] = [r]
            self.cold[r] = True
            ag.load_queue.append(a)
            self.start_loads(ag, now)

    def start_loads(self, ag: Agent, now: float) -> None:
        while ag.load_queue and ag.loaders_busy < LOADERS:
            if len(ag.slots) + ag.loaders_busy >= self.m.slots:
                victim = next((x for x in ag.slots if x not in ag.ref), None)
                if victim is None:
                    return
                del ag.slots[victim]
                ag.evictions += 1
            a = ag.load_queue.popleft()
            ag.loaders_busy += 1
            self.load_log.append((now, a))
            self.push(now + self.m.cold_load_ms / 1000.0, LOAD_DONE, ag.idx, a)

    def load_done(self, ag: Agent, a: int, now: float) -> None:
        ag.loaders_busy -= 1
        ag.slots[a] = None
        ag.waitq.extend(ag.blocked.pop(a))
        self.start_loads(ag, now)
        if not ag.busy:
            self.start_step(ag, now)

    def start_step(self, ag: Agent, now: float) -> None:
        m = self.m
        waitq, pq, batch = ag.waitq, ag.prefillq, ag.batch
        prompt, adapter = self.tr.prompt, self.tr.adapter
        while waitq and ag.n_admitted < m.max_num_seqs:
            r = waitq.popleft()
            pq.append([r, prompt[r]])
            a = adapter[r]
            batch[a] = batch.get(a, 0) + 1
            ag.n_admitted += 1
            ag.kv_used += -(-(prompt[r] + self.tr.output[r]) // m.block_size)
        rows = ag.n_decoding
        budget = m.max_batched_tokens - rows
        ptoks = 0
        done: list[int] = []
        for e in pq:
            if budget <= 0:
                break
            take = e[1] if e[1] < budget else budget
            e[1] -= take
            budget -= take
            ptoks += take
            if e[1] == 0:
                done.append(e[0])
        for _ in done:
            pq.popleft()
        if rows == 0 and ptoks == 0:
            ag.busy = False
            return
        dt = m.step_ms(rows, ptoks, len(batch))
        ag.busy = True
        ag.pending = done
        if self.t0 <= now < self.t1:
            ag.busy_ms += dt
        self.push(now + dt / 1000.0, STEP_END, ag.idx, 0)

    def step_end(self, ag: Agent, now: float) -> None:
        ag.step_no += 1
        s = ag.step_no
        fin = ag.finish
        output = self.tr.output
        while fin and fin[0][0] <= s:
            r = heapq.heappop(fin)[1]
            ag.n_decoding -= 1
            self.complete(ag, r, now)
        for r in ag.pending:
            self.first_t[r] = now
            if output[r] > 1:
                heapq.heappush(fin, (s + output[r] - 1, r))
                ag.n_decoding += 1
            else:
                self.complete(ag, r, now)
        ag.pending = []
        self.start_step(ag, now)

    def complete(self, ag: Agent, r: int, now: float) -> None:
        self.done_t[r] = now
        self.open -= 1
        a = self.tr.adapter[r]
        ag.n_admitted -= 1
        ag.total -= 1
        ag.kv_used -= -(-(self.tr.prompt[r] + self.tr.output[r]) // self.m.block_size)
        b = ag.batch[a] - 1
        if b:
            ag.batch[a] = b
        else:
            del ag.batch[a]
        c = ag.ref[a] - 1
        if c:
            ag.ref[a] = c
        else:
            del ag.ref[a]
            if ag.load_queue:
                self.start_loads(ag, now)
        if self.t0 <= now < self.t1:
            ag.tokens += self.tr.output[r]
        inflight = self.routers[self.tr.router[r]].local.inflight
        inflight[ag.idx] -= 1

    # ----- results -------------------------------------------------------------------
    def result(self, sat_tok_s: float, wall_s: float) -> Result:
        tr, t0, t1 = self.tr, self.t0, self.t1
        window = [r for r, t in enumerate(tr.arrive) if t0 <= t < t1]
        done = [r for r in window if self.done_t[r] >= 0]
        ttft = sorted((self.first_t[r] - tr.arrive[r]) * 1000.0 for r in done)
        cold = sorted((self.first_t[r] - tr.arrive[r]) * 1000.0 for r in done if self.cold[r])
        loads = sum(1 for t, _ in self.load_log if t0 <= t < t1)
        distinct = len({tr.adapter[r] for r in window})
        dur = self.sc.duration_s
        util = [ag.tokens / (sat_tok_s * dur) for ag in self.agents]
        return Result(
            policy=self.policy, requests=len(window), completed=len(done),
            rejected=sum(1 for r in window if self.rejected[r]), retries=self.retries,
            cold_loads=loads, cold_loads_per_s=loads / dur, distinct_adapters=distinct,
            amplification=loads / max(distinct, 1), ttft_p50_ms=percentile(ttft, 50),
            ttft_p99_ms=percentile(ttft, 99), ttft_cold_p99_ms=percentile(cold, 99),
            utilisation_mean=sum(util) / len(util), utilisation_max=max(util),
            busy_fraction_mean=sum(ag.busy_ms for ag in self.agents)
            / (len(self.agents) * dur * 1000.0),
            evictions=sum(ag.evictions for ag in self.agents), total_loads=len(self.load_log),
            total_distinct=len(set(tr.adapter)),
            total_completed=sum(1 for t in self.done_t if t >= 0),
            total_requests=len(tr.arrive), wall_s=wall_s)


def oracle_homes(sc: Scenario, model: EngineModel, trace: Trace,
                 agents: Sequence[Agent]) -> list[tuple[int, ...]]:
    """Each adapter's replica agents (module docstring, `oracle`); each agent starts with
    the `slots` heaviest of its assignment resident."""
    counts = [0] * sc.adapters
    for a in trace.adapter:
        counts[a] += 1
    share = max(len(trace.adapter) / sc.agents, 1.0)
    order = sorted(range(sc.adapters), key=lambda a: (-counts[a], a))
    assigned = [(0.0, i) for i in range(sc.agents)]
    heapq.heapify(assigned)
    homes: list[tuple[int, ...]] = [()] * sc.adapters
    for a in order:
        r = min(sc.agents, max(1, math.ceil(counts[a] / share)))
        chunk = counts[a] / r
        taken = [heapq.heappop(assigned) for _ in range(r)]
        homes[a] = tuple(i for _, i in taken)
        for work, i in taken:
            heapq.heappush(assigned, (work + chunk, i))
            if counts[a] and len(agents[i].slots) < model.slots:
                agents[i].slots[a] = None
                agents[i].slots.move_to_end(a, last=False)
    return homes


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (NaN when empty)."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def saturated(model: EngineModel, seed: int = 0) -> tuple[float, float]:
    """(output tok/s, req/s) of one agent kept full: 64 resident adapters, requests of
    the trace's lengths arriving at 4x its capacity, measured after a 5 s fill."""
    sc = Scenario(agents=1, adapters=64, zipf=0.0, rate=300.0, warmup_s=5.0,
                  duration_s=20.0, seed=seed, burst_mult=1.0)
    trace = make_trace(sc, sc.rate)
    sim = Sim(sc, model, trace, "single", preload=[list(range(64))], max_queued=10**9)
    sim.run()
    ag = sim.agents[0]
    done = sum(1 for t in sim.done_t if sc.warmup_s <= t < sc.warmup_s + sc.duration_s)
    return ag.tokens / sc.duration_s, done / sc.duration_s


def engine_trace(model: EngineModel, seed: int = 0) -> float:
    """Output tok/s of the "Engine" trace on one agent in this model: 256 requests at
    t = 0 on 128 resident adapters with Zipf(1.0) popularity, prompts 64-512, outputs
    64-128, output tokens / makespan (the measured 5,187-5,703 tok/s)."""
    rng = random.Random(f"engine-trace-{seed}")
    weights = [(k + 1) ** -1.0 for k in range(128)]
    n = 256
    trace = Trace(arrive=[i * 1e-9 for i in range(n)],
                  adapter=rng.choices(range(128), weights=weights, k=n),
                  prompt=[rng.randint(64, 512) for _ in range(n)],
                  output=[rng.randint(64, 128) for _ in range(n)], router=[0] * n, bursts=[])
    sc = Scenario(agents=1, adapters=128, warmup_s=0.0, duration_s=1e9, seed=seed)
    sim = Sim(sc, model, trace, "single", preload=[list(range(128))], max_queued=10**9)
    sim.run()
    return sum(trace.output) / max(sim.done_t)


def run_policy(sc: Scenario, model: EngineModel, policy: str, rate: float,
               sat_tok_s: float, sat_req_s: float, load_factor: float = LOAD_FACTOR) -> Result:
    started = time.perf_counter()
    trace = make_trace(sc, rate)
    sim = Sim(sc, model, trace, policy, load_factor=load_factor, sat_req_s=sat_req_s)
    sim.run()
    return sim.result(sat_tok_s, time.perf_counter() - started)


@dataclass
class Report:
    scenario: dict[str, Any]
    model: dict[str, Any]
    saturated_tok_s: float
    saturated_req_s: float
    engine_trace_tok_s: float
    rate: float
    results: list[Result] = field(default_factory=list)

    def ratios(self) -> dict[str, float]:
        by = {r.policy: r for r in self.results}
        out: dict[str, float] = {}
        if "product" in by and "least-loaded" in by:
            out["cold_loads_least_loaded_over_product"] = (
                by["least-loaded"].cold_loads / max(by["product"].cold_loads, 1))
            out["p99_product_over_least_loaded"] = (
                by["product"].ttft_p99_ms / by["least-loaded"].ttft_p99_ms)
        if "product" in by and "oracle" in by:
            out["p99_product_over_oracle"] = by["product"].ttft_p99_ms / by["oracle"].ttft_p99_ms
        return out


def simulate(sc: Scenario, model: EngineModel, policies: Sequence[str],
             jobs: int = 1, load_factor: float = LOAD_FACTOR) -> Report:
    sat_tok_s, sat_req_s = saturated(model, sc.seed)
    rate = sc.rate or sc.load * sc.agents * sat_req_s
    report = Report(asdict(sc), asdict(model), sat_tok_s, sat_req_s,
                    engine_trace(model, sc.seed), rate)
    if jobs > 1 and len(policies) > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, len(policies))) as pool:
            futures = [pool.submit(run_policy, sc, model, p, rate, sat_tok_s, sat_req_s,
                                   load_factor) for p in policies]
            report.results = [f.result() for f in futures]
    else:
        report.results = [run_policy(sc, model, p, rate, sat_tok_s, sat_req_s, load_factor)
                          for p in policies]
    return report


def header(report: Report) -> str:
    sc, m = report.scenario, report.model
    lines = [
        "# fleet routing, simulated (bench/fleet_sim.py)",
        f"# fleet: {sc['agents']} agents x {m['slots']} slots, {m['max_num_seqs']} seqs, "
        f"{m['max_batched_tokens']}-token steps; {sc['routers']} router(s), heartbeat "
        f"{sc['heartbeat_s']} s, table refresh {sc['refresh_s']} s",
        f"# workload: {sc['adapters']:,} adapters, Zipf({sc['zipf']}), on/off arrivals, mean "
        f"{report.rate:,.0f} req/s ({sc['calm_s']} s calm / {sc['burst_s']} s at "
        f"x{sc['burst_mult']}), prompts {sc['prompt_min']}-{sc['prompt_max']}, outputs "
        f"{sc['output_min']}-{sc['output_max']}; warm-up {sc['warmup_s']} s, measured "
        f"{sc['duration_s']} s, seed {sc['seed']}",
        "# step ms = {:.1f} x ({:.2f} + {:.5f} x decode rows + {:.5f} x prefill tokens "
        "[PERFORMANCE.md: Engine (decode step B=64; single runs, 128 seqs), "
        "Tensor parallel (TP=1 prefill 4,096 rows)]".format(
            m["step_scale"], m["step_base_ms"], m["decode_row_ms"], m["prefill_token_ms"]),
        f"#   + LoRA: decode (fold) +{m['fold_16_ms']} / +{m['fold_64_ms']} ms at 16 / 64 "
        "distinct [Unified pool and the LoRA fold]; with prefill (launched) "
        f"+{m['mixed_16_ms']} / +{m['mixed_64_ms']} ms + {m['mixed_row_ms']} ms/row above "
        f"{m['mixed_rows_ref']}) [Tensor parallel, mixed 576 rows; per-row: assumption; scale: "
        "calibrated to the Engine trace]",
        f"# cold load {m['cold_load_ms']} ms on {LOADERS} loaders [Adapter residency under a "
        "Zipf workload: cold - hit TTFT p50; pool path alone 2.138 ms: Cold adapter loads]",
        f"# one agent saturated: {report.saturated_tok_s:,.0f} output tok/s, "
        f"{report.saturated_req_s:.1f} req/s; the Engine trace (256 requests at t = 0, 128 "
        f"adapters) {report.engine_trace_tok_s:,.0f} tok/s (measured 5,187-5,703); offered "
        f"{report.rate / (sc['agents'] * report.saturated_req_s):.2f} of the fleet's",
    ]
    return "\n".join(lines)


def table(report: Report) -> str:
    rows = ["| policy | cold loads/s | amplification | TTFT p50 ms | TTFT p99 ms | "
            "cold TTFT p99 ms | rejected | utilisation mean / max |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in report.results:
        rows.append(f"| {r.policy} | {r.cold_loads_per_s:,.1f} | {r.amplification:.2f} | "
                    f"{r.ttft_p50_ms:,.0f} | {r.ttft_p99_ms:,.0f} | {r.ttft_cold_p99_ms:,.0f}"
                    f" | {r.rejected} | {r.utilisation_mean:.2f} / {r.utilisation_max:.2f} |")
    ratios = report.ratios()
    if "cold_loads_least_loaded_over_product" in ratios:
        x, y = (ratios["cold_loads_least_loaded_over_product"],
                ratios["p99_product_over_least_loaded"])
        rows.append(f"\nproduct: {x:.1f}x fewer cold loads than least-loaded (target >= 5), "
                    f"p99 TTFT {y:.2f}x least-loaded's (target <= 1): "
                    f"{'met' if x >= 5 and y <= 1 else 'missed'}")
    if "p99_product_over_oracle" in ratios:
        z = ratios["p99_product_over_oracle"]
        rows.append(f"product p99 TTFT {z:.2f}x the oracle's (target <= 1.5): "
                    f"{'met' if z <= 1.5 else 'missed'}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    d = Scenario()
    p.add_argument("--agents", type=int, default=d.agents)
    p.add_argument("--adapters", type=int, default=d.adapters)
    p.add_argument("--zipf", type=float, default=d.zipf)
    p.add_argument("--rate", type=float, default=d.rate,
                   help="mean req/s (default: --load x the fleet's saturated rate)")
    p.add_argument("--load", type=float, default=d.load)
    p.add_argument("--warmup-s", type=float, default=d.warmup_s)
    p.add_argument("--duration-s", type=float, default=d.duration_s)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--routers", type=int, default=d.routers)
    p.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s)
    p.add_argument("--refresh-s", type=float, default=d.refresh_s)
    p.add_argument("--calm-s", type=float, default=d.calm_s)
    p.add_argument("--burst-s", type=float, default=d.burst_s)
    p.add_argument("--burst-mult", type=float, default=d.burst_mult)
    p.add_argument("--cold-load-ms", type=float, default=EngineModel.cold_load_ms)
    p.add_argument("--slots", type=int, default=EngineModel.slots)
    p.add_argument("--step-scale", type=float, default=EngineModel.step_scale)
    p.add_argument("--load-factor", type=float, default=LOAD_FACTOR,
                   help="the product policy's bounded-load factor (route's load_factor)")
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    p.add_argument("--jobs", type=int, default=min(len(POLICIES), os.cpu_count() or 1),
                   help="policies simulated in parallel processes")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    sc = Scenario(agents=args.agents, adapters=args.adapters, zipf=args.zipf, rate=args.rate,
                  load=args.load, warmup_s=args.warmup_s, duration_s=args.duration_s,
                  seed=args.seed, routers=args.routers, heartbeat_s=args.heartbeat_s,
                  refresh_s=args.refresh_s, calm_s=args.calm_s, burst_s=args.burst_s,
                  burst_mult=args.burst_mult)
    model = EngineModel(cold_load_ms=args.cold_load_ms, slots=args.slots,
                        step_scale=args.step_scale)
    report = simulate(sc, model, args.policies, args.jobs, args.load_factor)
    if args.json:
        print(json.dumps({**asdict(report), "ratios": report.ratios()}, indent=2))
    else:
        print(header(report))
        print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
