"""Tenant fairness: completed weighted service, weights, priority classes, the fair order.

Scheduler-level tests drive the real Scheduler and BlockManager with a torch-free stand-in
for the model (test_scheduler.run_step); the engine-level test runs a tiny random Llama.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dataplane.core import InvalidRequest, SamplingParams, Sequence, SequenceStatus
from dataplane.engine import EngineConfig, EngineSpec, Scheduler, SchedulerConfig, build_engine
from dataplane.engine.fairness import (
    INPUT_WEIGHT,
    OUTPUT_WEIGHT,
    PRIORITY_CLASSES,
    TenantLedger,
)

from .test_scheduler import D, make_block_manager, run_step


def seq(rid: str, tenant: str, prompt_len: int = 4, max_tokens: int = 3,
        slot: int = -1) -> Sequence:
    return Sequence(rid, tuple(range(10, 10 + prompt_len)),
                    SamplingParams(max_tokens=max_tokens, ignore_eos=True), adapter_slot=slot,
                    adapter_digest=None if slot < 0 else D(f"adapter{slot}"), tenant=tenant)


def scheduler(policy: str = "fair", max_num_seqs: int = 1, pages: int = 64,
              ready: set[int] | None = None) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=max_num_seqs,
                                     policy=policy),
                     make_block_manager(pages),
                     adapter_ready=None if ready is None
                     else (lambda s: s.adapter_slot < 0 or s.adapter_slot in ready))


def test_local_selection_trace_picks_the_tenant_with_less_service() -> None:
    """The local selection fixture: r_hot's tenant has completed 3 units of service, r_peer's
    1, same urgency class, one sequence of budget: r_peer runs, although r_hot is older.
    r_cold's adapter is not ready: it gets no row however little service its tenant has.
    (The service was completed while the tenants were backlogged: credited after `add`.)"""
    sched = scheduler(ready={0, 2})
    for s in (seq("r_hot", "hot", slot=0), seq("r_cold", "cold", slot=1),
              seq("r_peer", "peer", slot=2)):
        sched.add(s)
    sched.tenants.credit("hot", input_tokens=3)
    sched.tenants.credit("peer", input_tokens=1)
    out = sched.schedule()
    assert [s.request_id for s, _ in out.prefills] == ["r_peer"]
    fcfs = scheduler("fcfs", ready={0, 2})
    for s in (seq("r_hot", "hot", slot=0), seq("r_cold", "cold", slot=1),
              seq("r_peer", "peer", slot=2)):
        fcfs.add(s)
    assert [s.request_id for s, _ in fcfs.schedule().prefills] == ["r_hot"]


def test_priority_class_comes_before_service() -> None:
    sched = scheduler()
    sched.tenants.set_policy({}, {"gold": PRIORITY_CLASSES["high"],
                                  "bulk": PRIORITY_CLASSES["low"]})
    for s in (seq("b", "bulk"), seq("n", "plain"), seq("g", "gold")):
        sched.add(s)
    sched.tenants.credit("gold", output_tokens=100)
    order: list[str] = []
    while sched.has_unfinished():
        out, _ = run_step(sched)
        order += [s.request_id for s, _ in out.prefills if s.request_id not in order]
    assert order == ["g", "n", "b"]


def test_weights_divide_service() -> None:
    """Tenant "big" (weight 4) has 4x the service of "small" (weight 1): a tie, broken by
    arrival; with a little more service "big" yields."""
    for big, first in ((40, "b1"), (41, "s1")):
        sched = scheduler()
        sched.tenants.set_policy({"big": 4.0}, {})
        sched.add(seq("b1", "big"))
        sched.add(seq("s1", "small"))
        sched.tenants.credit("big", input_tokens=big)
        sched.tenants.credit("small", input_tokens=10)
        assert [s.request_id for s, _ in sched.schedule().prefills] == [first]


def test_noisy_neighbour_cannot_starve_a_quiet_tenant() -> None:
    """Tenant A queues 40 requests before tenant B's 4 (all alike). Under fcfs B waits for
    all of A; under fair, while both are backlogged, B's service stays within one
    request's worth of A's, and B's requests all finish among the first ten."""
    def run(policy: str) -> tuple[list[str], list[tuple[float, float]]]:
        sched = scheduler(policy, max_num_seqs=2, pages=128)
        for i in range(40):
            sched.add(seq(f"a{i}", "A"))
        for i in range(4):
            sched.add(seq(f"b{i}", "B"))
        finished: list[str] = []
        shares = []
        while sched.has_unfinished():
            _, updates = run_step(sched)
            finished += [u.seq.request_id for u in updates if u.finished]
            if any(s.tenant == "B" for s in [*sched.waiting, *sched.running]):
                shares.append((sched.tenants.service.get("A", 0.0),
                               sched.tenants.service.get("B", 0.0)))
        return finished, shares

    fcfs, _ = run("fcfs")
    assert all(r.startswith("a") for r in fcfs[:40])
    fair, shares = run("fair")
    b_done = [i for i, r in enumerate(fair) if r.startswith("b")]
    assert len(b_done) == 4 and max(b_done) < 10
    one_request = INPUT_WEIGHT * 4 + OUTPUT_WEIGHT * 3
    assert all(a - b <= 2 * one_request for a, b in shares)


def test_a_tenant_returning_from_idle_is_lifted_not_credited() -> None:
    """B was idle while A accumulated service: on B's return its service is lifted to A's
    (weights equal), so B does not monopolise the engine for the time it was away."""
    ledger = TenantLedger()
    ledger.enter("A")
    ledger.credit("A", input_tokens=100)
    ledger.enter("B")
    assert ledger.service["B"] == ledger.service["A"] == 100.0
    ledger.leave("B")
    ledger.credit("A", output_tokens=10)
    ledger.credit("B", output_tokens=1)
    ledger.enter("B")  # A still backlogged at 120: B (102) is lifted to 120
    assert ledger.service["B"] == 120.0
    ledger.leave("A")
    ledger.leave("B")
    ledger.enter("C")  # nobody backlogged: nothing to lift to
    assert ledger.service.get("C", 0.0) == 0.0


@pytest.mark.parametrize("weights, priorities", [
    ({"a": 0.0}, {}), ({"a": -1.0}, {}), ({"a": math.nan}, {}), ({"a": math.inf}, {}),
    ({"a": 1001.0}, {}), ({"a": True}, {}), ({}, {"a": 3}), ({}, {"a": -1}),
    ({}, {"a": "high"})])
def test_bad_tenant_policy_is_refused_and_changes_nothing(weights: dict[str, float],
                                                          priorities: dict[str, int]) -> None:
    ledger = TenantLedger()
    ledger.set_policy({"kept": 2.0}, {"kept": 0})
    with pytest.raises(InvalidRequest):
        ledger.set_policy({"ok": 3.0, **weights}, {"ok": 2, **priorities})
    assert ledger.weights == {"kept": 2.0} and ledger.priorities == {"kept": 0}


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="scheduling policy"):
        SchedulerConfig(policy="random")
    with pytest.raises(InvalidRequest, match="scheduling_policy"):
        EngineConfig(scheduling_policy="lifo")


def test_planned_rows_of_an_aborted_request_are_not_service() -> None:
    """A prefill scheduled, then the request aborted before the step's results: nothing is
    credited; the other request's completed chunk and token are."""
    sched = scheduler(max_num_seqs=2)
    sched.add(seq("kept", "A"))
    sched.add(seq("gone", "B"))
    out = sched.schedule()
    assert len(out.prefills) == 2
    sched.abort("gone")
    sched.postprocess(out, [11] * len(out.sampled))
    assert sched.tenants.service.get("B", 0.0) == 0.0
    assert sched.tenants.service["A"] == INPUT_WEIGHT * 4 + OUTPUT_WEIGHT * 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("ABC"), st.integers(1, 12), st.integers(1, 5),
                          st.booleans()), min_size=1, max_size=14),
       st.integers(1, 4), st.integers(4, 24), st.sampled_from(["fair", "fcfs"]))
def test_service_is_the_sum_of_completion_events(
        requests: list[tuple[str, int, int, bool]], max_num_seqs: int, budget: int,
        policy: str) -> None:
    """Random requests (some aborted mid-way), chunked prefill, preemption under a small
    pool: each tenant's service equals the prompt tokens whose K/V a committed step
    computed plus the tokens applied to it, counted here from the steps' outputs; and every
    request ends (nobody starves)."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                      policy=policy), make_block_manager(12))
    expected: dict[str, float] = {}
    for i, (tenant, prompt, out_len, _abort) in enumerate(requests):
        sched.add(seq(f"r{i}", tenant, prompt_len=prompt, max_tokens=out_len))
    aborts = {f"r{i}" for i, r in enumerate(requests) if r[3]}
    steps = 0
    while sched.has_unfinished():
        steps += 1
        assert steps < 500, "a request starved"
        out = sched.schedule()
        if out.is_empty:
            continue
        victim = next((s for s, _ in out.prefills if s.request_id in aborts), None)
        if victim is not None:
            sched.abort(victim.request_id)
            aborts.discard(victim.request_id)
        for s, n in out.prefills:
            if s.status is SequenceStatus.RUNNING:
                expected[s.tenant] = expected.get(s.tenant, 0.0) + INPUT_WEIGHT * n
        for s in out.decodes:
            if s.status is SequenceStatus.RUNNING:
                expected[s.tenant] = expected.get(s.tenant, 0.0)
        applied = [s for s in out.sampled if s.status is SequenceStatus.RUNNING]
        for s in applied:
            expected[s.tenant] = expected.get(s.tenant, 0.0) + OUTPUT_WEIGHT
        sched.postprocess(out, [42] * len(out.sampled))
    assert {t: v for t, v in sched.tenants.service.items() if v} == \
        {t: v for t, v in expected.items() if v}
    assert sched.tenants.live == {}


def test_engine_credits_each_tenant_and_takes_a_policy(tiny_llama: Path) -> None:
    """Through the public Engine: a tenant's service is its prompts' and outputs' tokens
    (weighted); `set_tenant_policy` validates before it changes anything."""
    engine = build_engine(EngineSpec.of(tiny_llama, max_slots=0, max_rank=16,
                                        num_kv_blocks=64, block_size=4, max_num_seqs=4,
                                        max_num_batched_tokens=64))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    for rid, tenant, prompt in (("x", "ns-a", [5, 6, 7, 8]), ("y", "ns-b", [9, 10]),
                                ("z", "ns-a", [11, 12, 13])):
        engine.add_request(rid, prompt, params, tenant=tenant)
    while engine.has_unfinished():
        engine.step()
    assert engine.tenant_service() == {
        "ns-a": INPUT_WEIGHT * 7 + OUTPUT_WEIGHT * 6, "ns-b": INPUT_WEIGHT * 2 + OUTPUT_WEIGHT * 3}
    with pytest.raises(InvalidRequest):
        engine.set_tenant_policy({"ns-a": 0.0}, {})
    engine.set_tenant_policy({"ns-a": 2.0}, {"ns-b": 0})
    assert engine.scheduler.tenants.weight("ns-a") == 2.0
    with pytest.raises(InvalidRequest, match="tenant"):
        engine.add_request("bad", [1, 2], params, tenant=7)  # type: ignore[arg-type]


def test_same_round_arrivals_prefer_an_adapter_already_in_the_batch() -> None:
    """The cost vector after age: of two requests queued in the same round, the one whose
    adapter already has rows in the step adds no kernel run and is admitted first; a
    request queued a round earlier still goes first (age before cost); fcfs keeps arrival
    order."""
    def admitted(policy: str) -> list[str]:
        sched = scheduler(policy, max_num_seqs=2)
        sched.add(seq("first", "t", slot=0, max_tokens=8))
        run_step(sched)  # round 1 admits "first": slot 0 now has rows in every step
        sched.add(seq("other", "t", slot=1))
        sched.add(seq("same", "t", slot=0))
        out = sched.schedule()
        return [s.request_id for s, _ in out.prefills]

    assert admitted("fair") == ["same"]
    assert admitted("fcfs") == ["other"]


def test_same_round_arrivals_prefer_the_lower_rank() -> None:
    sched = scheduler(max_num_seqs=1)
    high = seq("high", "t", slot=0)
    low = seq("low", "t", slot=1)
    high.adapter_rank, low.adapter_rank = 16, 4
    sched.add(high)
    sched.add(low)
    assert [s.request_id for s, _ in sched.schedule().prefills] == ["low"]


def test_age_in_rounds_comes_before_the_cost_vector() -> None:
    """"old" waits from an earlier round than "new", whose adapter has rows in the batch:
    when a seat frees, age wins."""
    sched = scheduler(max_num_seqs=2)
    sched.add(seq("long", "t", slot=0, max_tokens=30))
    sched.add(seq("short", "t", slot=2, max_tokens=2))
    run_step(sched)  # the batch is full
    sched.add(seq("old", "t", slot=1))
    run_step(sched)
    sched.add(seq("new", "t", slot=0))
    while len(sched.running) == 2:
        run_step(sched)
    out = sched.schedule()
    assert [s.request_id for s, _ in out.prefills] == ["old"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("AAAABCD"), st.integers(0, 8), st.integers(1, 12),
                          st.integers(1, 6)), min_size=2, max_size=30),
       st.integers(1, 3))
@example([("A", 0, 12, 6)] * 20 + [("B", 1, 12, 6)], 1)  # a flood: fcfs makes B wait 119
def test_no_ready_tenant_waits_unserved_longer_than_a_bound(
        arrivals: list[tuple[str, int, int, int]], max_num_seqs: int) -> None:
    """Random traces (tenant, arrival step, prompt, output length) under the fair policy
    with a roomy pool: a tenant with a ready request waiting is served (some request of
    it admitted) within T x (the longest request's steps + 1) steps, T the tenants."""
    sched = scheduler(max_num_seqs=max_num_seqs, pages=256)
    longest = max(-(-p // 64) + o for _, _, p, o in arrivals) + 1
    bound = len({t for t, *_ in arrivals}) * longest
    pending = sorted(arrivals, key=lambda a: a[1])
    waiting_since: dict[str, int] = {}
    step = n = 0
    while pending or sched.has_unfinished():
        while pending and pending[0][1] <= step:
            tenant, _, prompt, out_len = pending.pop(0)
            n += 1
            sched.add(seq(f"r{n}", tenant, prompt_len=prompt, max_tokens=out_len))
        for s in sched.waiting:
            waiting_since.setdefault(s.tenant, step)
        out = sched.schedule()
        for s, _ in out.prefills:
            waiting_since.pop(s.tenant, None)
        for tenant, since in waiting_since.items():
            assert step - since <= bound, (tenant, step - since, bound)
        if not out.is_empty:
            sched.postprocess(out, [42] * len(out.sampled))
        step += 1
        assert step < 2000


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("xyz"), st.integers(-1, 3), st.integers(1, 16),
                          st.integers(0, 2)), min_size=1, max_size=24),
       st.dictionaries(st.sampled_from("xyz"), st.integers(0, 40)),
       st.integers(1, 24))
def test_one_round_admits_in_the_order_of_the_fair_key(
        requests: list[tuple[str, int, int, int]], service: dict[str, int], seats: int) -> None:
    """One admission round against the ordering rule applied naively: every admission
    takes the minimum over all remaining requests of (class, service / weight, age round,
    cost vector with the runs already in the step, arrival, id)."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=seats),
                      make_block_manager(4096))
    queued = []
    for rnd in range(3):
        sched.rounds = rnd  # requests queued in three different rounds
        for i, (tenant, slot, rank, when) in enumerate(requests):
            if when == rnd:
                s = seq(f"r{i:02d}", tenant, slot=slot)
                s.adapter_rank = rank
                sched.add(s)
                queued.append(s)
    for tenant, units in service.items():
        sched.tenants.credit(tenant, input_tokens=units)
    expected, active, left = [], set(), list(queued)
    while left and len(expected) < seats:
        def key(s: Sequence) -> tuple[object, ...]:
            run = 0 if s.adapter_slot in active else 1
            return (sched.tenants.normalized(s.tenant), s.arrival_round,
                    (0, run, s.adapter_rank, s.adapter_rank, 0), s.arrival, s.request_id)
        best = min(left, key=key)
        left.remove(best)
        active.add(best.adapter_slot)
        expected.append(best.request_id)
    assert [s.request_id for s, _ in sched.schedule().prefills] == expected
