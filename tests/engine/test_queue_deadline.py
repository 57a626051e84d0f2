"""Queue deadlines: a request not admitted in time is dropped unstarted, at its deadline or
as soon as the estimated wait for its prefill exceeds it; the offered / admitted / expired
ledger. The scheduler runs on a test clock."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dataplane.core import FinishReason, InvalidRequest, SamplingParams, Sequence
from dataplane.engine import EngineSpec, Scheduler, SchedulerConfig, build_engine

from .test_scheduler import make_block_manager, run_step


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def seq(rid: str, prompt_len: int = 4, deadline: float | None = None,
        tenant: str = "") -> Sequence:
    return Sequence(rid, tuple(range(10, 10 + prompt_len)),
                    SamplingParams(max_tokens=4, ignore_eos=True), tenant=tenant,
                    queue_deadline=deadline)


@pytest.mark.parametrize("policy", ["fair", "fcfs"])
def test_a_request_waiting_past_its_deadline_is_dropped_unstarted(policy: str) -> None:
    clock = Clock()
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1, policy=policy),
                      make_block_manager(32), clock=clock)
    sched.add(seq("running"))
    sched.add(seq("patient"))
    sched.add(seq("hurried", deadline=clock.now + 0.5, tenant="t"))
    out, _ = run_step(sched)
    assert [s.request_id for s, _ in out.prefills] == ["running"] and not out.expired
    clock.now += 0.4
    out, _ = run_step(sched)
    assert not out.expired  # not yet
    clock.now += 0.2
    out, _ = run_step(sched)
    assert [s.request_id for s in out.expired] == ["hurried"]
    dropped = out.expired[0]
    assert dropped.finish_reason is FinishReason.DEADLINE and dropped.is_finished
    assert dropped.output_token_ids == [] and dropped.block_table == []
    assert "t" not in sched.tenants.live
    while sched.has_unfinished():
        run_step(sched)
    assert sched.counts == {"offered": 3, "admitted": 2, "expired": 1}


def test_early_abort_when_the_estimated_wait_exceeds_the_deadline() -> None:
    """Steps take 1 s (observed); 40 prompt tokens queue ahead at 16 per step: the request
    cannot be admitted within 2 s, so it is dropped now, not at its deadline; one whose
    deadline leaves room stays."""
    clock = Clock()
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=1),
                      make_block_manager(64), clock=clock)
    sched.add(seq("r0", prompt_len=8))
    run_step(sched)
    clock.now += 1.0
    run_step(sched)  # one interval between busy steps observed: 1 s
    assert sched.step_interval == pytest.approx(1.0)
    for i in range(5):
        sched.add(seq(f"q{i}", prompt_len=8))
    sched.add(seq("doomed", deadline=clock.now + 2.0))
    sched.add(seq("fine", deadline=clock.now + 10.0))
    clock.now += 1.0
    out, _ = run_step(sched)
    assert [s.request_id for s in out.expired] == ["doomed"]
    assert "fine" in [s.request_id for s in sched.waiting]


def test_preempted_requests_are_never_expired() -> None:
    """A request that was admitted once has started: its deadline no longer applies."""
    clock = Clock()
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4),
                      make_block_manager(32), clock=clock)
    s = seq("started", deadline=clock.now + 1.0)
    sched.add(s)
    run_step(sched)
    sched._preempt(s, sched.schedule())
    clock.now += 5.0
    out = sched.schedule()
    assert not out.expired and any(x.request_id == "started" for x, _ in out.prefills)


@pytest.mark.parametrize("async_on", [False, True], ids=["sync", "async"])
def test_engine_reports_a_dropped_request_and_refuses_bad_deadlines(tiny_llama: Path,
                                                                    async_on: bool) -> None:
    """Async: the drop is decided by the continuation step launched while "long" runs."""
    engine = build_engine(EngineSpec.of(tiny_llama, max_slots=0, max_rank=16,
                                        num_kv_blocks=64, block_size=4, max_num_seqs=1,
                                        max_num_batched_tokens=64, async_scheduling=async_on))
    clock = Clock()
    engine.scheduler.clock = clock
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine.add_request("long", [5, 6, 7], params)
    engine.add_request("late", [8, 9], params, max_queue_s=0.25)
    outs = engine.step()
    assert [o.request_id for o in outs] == ["long"]
    clock.now += 0.3
    outs = engine.step()
    late = [o for o in outs if o.request_id == "late"]
    assert len(late) == 1 and late[0].finished and late[0].finish_reason == "deadline"
    assert late[0].token_ids == ()
    assert engine.admission_counts() == {"offered": 2, "admitted": 1, "expired": 1}
    assert not engine.abort("late")  # gone already
    for bad in (0, -1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(InvalidRequest, match="max_queue_s"):
            engine.add_request(f"bad-{bad}", [1, 2], params, max_queue_s=bad)  # type: ignore[arg-type]
    while engine.has_unfinished():
        engine.step()
    assert engine.admission_counts()["offered"] == 2
    assert (engine.num_overlapped_steps > 0) is async_on


def test_overload_choice_serves_the_newest_feasible_requests() -> None:
    """The early-abort fixture: now 10, estimated wait 2, two serviceable, arrivals at 5/s
    against admissions at 2/s: q0 (arrived at 0) can no longer start within its limit of 8;
    of q1..q3 the newest two, [q3, q2]. Without overload, the oldest feasible first."""
    from dataplane.engine.overload import Candidate, serviceable_choice

    queue = [Candidate(f"q{i}", t, 8.0) for i, t in enumerate((0.0, 4.0, 6.0, 8.0))]
    assert serviceable_choice(queue, 10.0, 2.0, 2, 5.0, 2.0) == ["q3", "q2"]
    assert serviceable_choice(queue, 10.0, 2.0, 2, 2.0, 5.0) == ["q1", "q2"]


def test_newest_first_admits_the_newest_only_under_overload() -> None:
    """Three requests arrive and are admitted one a second; then six arrive within half a
    second: arrivals outrun admissions, and the newest is admitted first. A fresh engine
    with two queued requests has no rate estimate yet: the oldest first."""
    clock = Clock()
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1,
                                      policy="newest_first"), make_block_manager(64), clock=clock)
    for i in range(3):
        sched.add(seq(f"c{i}"))
        while sched.has_unfinished():
            run_step(sched)
        clock.now += 1.0
    for i in range(6):
        sched.add(seq(f"r{i}"))
        clock.now += 0.1
    assert sched.overloaded(clock.now)
    out, _ = run_step(sched)
    assert [s.request_id for s, _ in out.prefills] == ["r5"]
    fresh = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1,
                                      policy="newest_first"), make_block_manager(64), clock=clock)
    fresh.add(seq("old"))
    clock.now += 0.1
    fresh.add(seq("new"))
    assert not fresh.overloaded(clock.now)
    out, _ = run_step(fresh)
    assert [s.request_id for s, _ in out.prefills] == ["old"]
