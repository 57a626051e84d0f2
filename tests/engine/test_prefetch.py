"""Loads for waiting requests (dataplane/engine/prefetch.py) with the real Scheduler and
BlockManager: the design's first-fit prefetch fixture, its six-tick starvation witness,
and page conservation with loads and KV growth interleaved."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.core import SamplingParams, Sequence
from dataplane.engine import Scheduler, SchedulerConfig
from dataplane.engine.prefetch import LoadCandidate, due_loads, first_fit, load_budget
from dataplane.kvcache.page_pool import PageKind

from .test_scheduler import D, make_block_manager, run_step


def test_first_fit_prefetch_fixture() -> None:
    """Waiting adapters [B, B, C, D], pages B 3 / C 4 / D 2, 6 pages available: B and D
    (5 pages); C does not fit after B and does not block D."""
    pages = {"B": 3, "C": 4, "D": 2}
    queue = [(a, pages[a]) for a in ("B", "B", "C", "D")]
    chosen = first_fit(queue, available=6)
    assert chosen == ["B", "D"]
    assert sum(pages[a] for a in chosen) == 5


def test_due_loads_need_the_age_and_go_by_urgency_then_age() -> None:
    cands = [LoadCandidate("X", 1, queued_at=5.0), LoadCandidate("Y", 1, queued_at=1.0),
             LoadCandidate("X", 1, queued_at=2.0), LoadCandidate("Z", 1, queued_at=4.0,
                                                                urgency=0)]
    assert due_loads(cands, now=6.0, min_age=2.0) == [
        LoadCandidate("Z", 1, 4.0, 0), LoadCandidate("Y", 1, 1.0),
        LoadCandidate("X", 1, 2.0)]
    assert due_loads(cands, now=6.0, min_age=4.0) == [LoadCandidate("Y", 1, 1.0),
                                                      LoadCandidate("X", 1, 2.0)]


def test_load_budget_keeps_promised_growth_and_safety() -> None:
    assert load_budget(10, committed_kv_growth=4, safety=1) == 5
    assert load_budget(3, committed_kv_growth=4) == 0


def _witness(min_age: float) -> tuple[list[str], dict[str, int], list[str]]:
    """Six ticks: adapter A resident (slot 0), B cold (slot 1); c0 on B queued at tick 0,
    a new request on A at every tick; one request per tick. A load that is due starts at
    its tick and publishes at the next. Returns who ran, completions per tenant, and the
    adapters load-eligible throughout that were never published."""
    ready = {0}
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1),
                      make_block_manager(64),
                      adapter_ready=lambda s: s.adapter_slot in ready)

    def req(rid: str, tenant: str, slot: int) -> Sequence:
        return Sequence(rid, (7,), SamplingParams(max_tokens=1, ignore_eos=True),
                        adapter_slot=slot, adapter_digest=D(f"adapter{slot}"), tenant=tenant)

    ran: list[str] = []
    done: dict[str, int] = {}
    loading: set[int] = set()
    sched.add(req("c0", "cold", 1))
    for tick in range(6):
        ready |= loading  # the load started last tick publishes now
        loading = set()
        sched.add(req(f"h{tick}", "hot", 0))
        waiting = [s for s in sched.waiting if s.adapter_slot not in ready]
        due = due_loads((LoadCandidate(str(s.adapter_slot), 1, s.arrival_round)
                         for s in waiting), now=sched.rounds, min_age=min_age)
        loading = {int(c.adapter) for c in due}
        out, updates = run_step(sched)
        ran += [s.request_id for s, _ in out.prefills]
        for u in updates:
            if u.finished:
                done[u.seq.tenant] = done.get(u.seq.tenant, 0) + 1
    starved = [] if 1 in ready else ["B"]
    return ran, done, starved


def test_six_tick_starvation_witness() -> None:
    greedy = _witness(min_age=math.inf)  # resident-greedy: never loads a cold adapter
    assert greedy == (["h0", "h1", "h2", "h3", "h4", "h5"], {"hot": 6}, ["B"])
    fair = _witness(min_age=2)  # prefetch at age 2, publish at tick 3, run c0
    assert fair == (["h0", "h1", "h2", "c0", "h3", "h4"], {"hot": 5, "cold": 1}, [])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "step", "load", "unload", "reserve"]),
                          st.integers(1, 6)), min_size=1, max_size=60))
def test_pages_conserved_with_loads_and_kv_growth_interleaved(
        ops: list[tuple[str, int]]) -> None:
    """Random adds, steps, adapter loads (taken from the same page pool only within the
    load budget), unloads and load reservations: pages are conserved, and right after a
    load the running requests can still grow to their maximum length."""
    total = 24
    bm = make_block_manager(total)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4), bm)
    adapters: list[list[int]] = []
    n = 0
    for op, k in ops:
        if op == "add":
            n += 1
            sched.add(Sequence(f"r{n}", tuple(range(1, 2 + k)),
                               SamplingParams(max_tokens=2 * k, ignore_eos=True)))
        elif op == "step":
            before = set(map(id, sched.running))
            out = sched.schedule()
            if any(id(s) not in before for s, _ in out.prefills):  # admitted this step
                assert bm.num_free_blocks >= sched.load_reservation
            sched.postprocess(out, [3] * len(out.sampled))
        elif op == "load":
            budget = load_budget(bm.num_free_blocks, sched.committed_kv_growth())
            if k <= budget and bm.pool.can_allocate(k):
                adapters.append(bm.pool.allocate(k, PageKind.ADAPTER))
                assert bm.num_free_blocks >= sched.committed_kv_growth()
        elif op == "unload" and adapters:
            bm.pool.free(adapters.pop(0), PageKind.ADAPTER)
        elif op == "reserve":
            sched.load_reservation = k if sched.load_reservation == 0 else 0
        held = sum(len(a) for a in adapters)
        assert bm.pool.num_free + bm.num_held_blocks + held == total
