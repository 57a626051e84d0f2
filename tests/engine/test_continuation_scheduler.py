"""Scheduler phases for async scheduling, torch-free: driving commit -> reserve ->
schedule_continuation -> apply_tokens as the async engine does gives every request the same
tokens and finish reason as the synchronous schedule() -> postprocess() loop, and frees every
block — for random workloads with staggered arrivals (admitted into continuations), chunked
prefills, budgets, stop tokens, max_tokens, aborts and pools small enough to preempt.

The model is a stand-in: a fixed function of a sequence's real tokens, so a request's output
cannot depend on when or with whom it ran; any difference is a scheduling bug.
"""

from __future__ import annotations

import hashlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.core import (
    PLACEHOLDER_TOKEN,
    SamplingParams,
    Sequence,
    SequenceStatus,
    build_batch_plan,
)
from dataplane.engine import ScheduleOutput, Scheduler, SchedulerConfig, StepUpdate
from dataplane.kvcache import BlockManager, CacheABI, FreeListPagePool

BS = 4
RUNNING = SequenceStatus.RUNNING


def next_token(tokens: list[int]) -> int:
    assert PLACEHOLDER_TOKEN not in tokens
    return (sum(t * (i + 1) for i, t in enumerate(tokens)) % 89) + 10


def _scheduler(pages: int, seqs: int, budget: int) -> Scheduler:
    abi = CacheABI(base_digest=hashlib.sha256(b"base").hexdigest(), kv_dtype="float32",
                   block_size=BS)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seqs),
                     BlockManager(FreeListPagePool(pages), abi), eos_token_ids=())


def _plan(out: ScheduleOutput, prev: ScheduleOutput | None) -> None:
    """The plan is valid; its placeholder rows are exactly prev's sampled decodes."""
    plan = build_batch_plan(out.prefills, out.decodes, block_size=BS, generation=0)
    holes = {plan.request_ids[plan.row_request[i]] for i, t in enumerate(plan.input_ids)
             if t == PLACEHOLDER_TOKEN}
    fed = {s.request_id for s in out.decodes} & {s.request_id for s in (
        prev.sampled if prev is not None else [])}
    assert holes == fed


def _live(out: ScheduleOutput) -> bool:
    return any(s.status is RUNNING for s in [*out.decodes, *(s for s, _ in out.prefills)])


def drive(spec: dict, async_on: bool) -> tuple[dict[str, tuple], int, int]:
    sched = _scheduler(spec["pages"], spec["seqs"], spec["budget"])
    streamed: dict[str, list[int]] = {}
    finals: dict[str, tuple] = {}
    inflight: ScheduleOutput | None = None
    overlapped = mixed = 0
    for call in range(400):
        for i, (plen, max_tokens, stop, arrive) in enumerate(spec["reqs"]):
            if arrive == call:
                prompt = tuple((7 * i + k) % 50 + 1 for k in range(plen))
                sched.add(Sequence(f"r{i}", prompt, SamplingParams(
                    temperature=0, max_tokens=max_tokens, stop_token_ids=stop)))
        if spec["abort"] is not None and spec["abort"][1] == call:
            sched.abort(spec["abort"][0])
        updates: list[StepUpdate]
        if not async_on:
            out = sched.schedule()
            if not out.is_empty:
                _plan(out, None)
                updates = sched.postprocess(out, [next_token(s.token_ids) for s in out.sampled])
            else:
                updates = []
        else:
            cur, inflight = inflight, None
            if cur is not None and not _live(cur):
                cur = None
            if cur is None:
                cur = sched.schedule()
                if not cur.is_empty:
                    _plan(cur, None)
            if cur.is_empty:
                updates = []
            else:
                sched.commit_computed(cur)
                sched.reserve_tokens(cur)
                inflight = sched.schedule_continuation(cur)
                if inflight is not None:
                    _plan(inflight, cur)
                    overlapped += 1
                    mixed += bool(inflight.prefills)
                tokens = [next_token(s.token_ids[:-1]) if s.status is RUNNING else 0
                          for s in cur.sampled]
                updates = sched.apply_tokens(cur, tokens)
        for u in updates:
            streamed.setdefault(u.seq.request_id, []).append(u.token_id)
            if u.finished:
                finals[u.seq.request_id] = (tuple(u.seq.output_token_ids),
                                            u.seq.finish_reason)
                assert streamed[u.seq.request_id] == list(u.seq.output_token_ids)
        if call > max(r[3] for r in spec["reqs"]) and not sched.has_unfinished():
            break
    assert not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == spec["pages"]  # nothing leaked
    if spec["abort"] is not None:
        finals["aborted-prefix"] = tuple(streamed.get(spec["abort"][0], []))
    return finals, overlapped, mixed


request = st.tuples(st.integers(1, 9), st.integers(1, 8),
                    st.lists(st.integers(10, 98), max_size=3).map(tuple), st.integers(0, 5))
workload = st.fixed_dictionaries({
    "pages": st.integers(6, 24), "seqs": st.integers(1, 4), "budget": st.integers(4, 16),
    "reqs": st.lists(request, min_size=1, max_size=6),
    "abort": st.none() | st.tuples(st.sampled_from([f"r{i}" for i in range(6)]),
                                   st.integers(0, 8)),
})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload)
def test_async_phases_match_synchronous_loop(spec: dict) -> None:
    sync, _, _ = drive(spec, async_on=False)
    asyn, _, _ = drive(spec, async_on=True)
    aborted = spec["abort"][0] if spec["abort"] is not None else None
    assert {k: v for k, v in sync.items() if k not in (aborted, "aborted-prefix")} == \
        {k: v for k, v in asyn.items() if k not in (aborted, "aborted-prefix")}
    if aborted is not None:  # streamed before the abort: a prefix of the unaborted output
        alone, _, _ = drive({**spec, "abort": None}, async_on=False)
        for run in (sync, asyn):
            part = run["aborted-prefix"]
            if aborted in alone:
                assert alone[aborted][0][:len(part)] == part


def _in_flight(pages: int, seqs: int, first: list[Sequence], arriving: list[Sequence]
               ) -> tuple[Scheduler, ScheduleOutput]:
    """A scheduler whose step over `first` is committed and reserved (still "on the
    device"), with `arriving` queued after it was launched."""
    sched = _scheduler(pages=pages, seqs=seqs, budget=16)
    for seq in first:
        sched.add(seq)
    out = sched.schedule()
    sched.commit_computed(out)
    sched.reserve_tokens(out)
    for seq in arriving:
        sched.add(seq)
    return sched, out


def _greedy(rid: str, prompt: tuple[int, ...], max_tokens: int = 16) -> Sequence:
    return Sequence(rid, prompt, SamplingParams(temperature=0, max_tokens=max_tokens))


def test_continuation_overlaps_steady_decode_and_admits_arrivals() -> None:
    spec = {"pages": 24, "seqs": 4, "budget": 16, "abort": None,
            "reqs": [(3, 8, (), 0), (5, 8, (), 0), (2, 3, (), 0), (4, 6, (), 4)]}
    _, overlapped, mixed = drive(spec, async_on=True)
    assert overlapped > mixed > 0  # steady decodes, and the late request's admission
    a, b = _greedy("a", (1, 2, 3), 4), _greedy("b", (4, 5))
    sched, out = _in_flight(24, 4, [a], [b])
    # a request that arrived while `out` runs is admitted into the continuation, beside
    # a's decode (its input: the placeholder out samples)
    nxt = sched.schedule_continuation(out)
    assert nxt is not None and nxt.decodes == [a] and nxt.prefills == [(b, 2)]
    assert nxt.sampled == [b, a] and b.status is RUNNING
    _plan(nxt, out)
    sched.apply_tokens(out, [9])
    assert a.output_token_ids == [9]


def test_continuation_falls_back_to_the_synchronous_step() -> None:
    # nothing continues with a row: `out` finishes its only request by length
    sched, out = _in_flight(24, 4, [_greedy("a", (1, 2, 3), 1)], [_greedy("b", (4, 5))])
    free, rounds = sched.block_manager.num_free_blocks, sched.rounds
    assert sched.schedule_continuation(out) is None
    assert sched.block_manager.num_free_blocks == free and sched.rounds == rounds
    assert [s.request_id for s in sched.waiting] == ["b"]
    # a decode needs a block the pool does not have: the synchronous step preempts
    c, d = _greedy("c", (1, 2, 3, 4), 8), _greedy("d", (1, 2, 3, 4), 8)
    sched, out = _in_flight(3, 4, [c, d], [])
    assert {s.request_id for s in out.sampled} == {"c", "d"}
    free = sched.block_manager.num_free_blocks
    assert sched.schedule_continuation(out) is None and free == 1  # two decodes need two
    assert sched.block_manager.num_free_blocks == 1 and c.num_tokens == d.num_tokens == 5


def test_finishing_requests_seats_are_free_in_the_continuation() -> None:
    """A request `prev` finishes by length frees its seat for the continuation's
    admission (its blocks stay `prev`'s until it is applied)."""
    b, c = _greedy("b", (4, 5, 6), 5), _greedy("c", (7, 8))
    sched, out = _in_flight(24, 2, [_greedy("a", (1, 2, 3), 1), b], [c])
    nxt = sched.schedule_continuation(out)
    assert nxt is not None and nxt.decodes == [b] and nxt.prefills == [(c, 2)]
    updates = sched.apply_tokens(out, [11, 12])
    assert [(u.seq.request_id, u.finished) for u in updates] == [("a", True), ("b", False)]
    assert [s.request_id for s in sched.running] == ["b", "c"]
