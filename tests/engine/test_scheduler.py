"""Scheduler: budgets, chunked prefill, decode-first mixing, FCFS, preemption, readiness.

The tests drive Scheduler + build_batch_plan as the engine does, with a torch-free stand-in
for the model: a fixed function of a sequence's tokens, so a request's output cannot depend
on batching, chunking or preemption — any difference is a scheduler bug.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.core import (
    FinishReason,
    InvalidRequest,
    SamplingParams,
    Sequence,
    SequenceStatus,
    build_batch_plan,
)
from dataplane.engine import ScheduleOutput, Scheduler, SchedulerConfig, SchedulerError, StepUpdate
from dataplane.kvcache import (
    BlockManager,
    CacheABI,
    FreeListPagePool,
    KVCapacityError,
    PageKind,
)

BS = 4


def next_token(tokens: list[int]) -> int:
    return (sum(t * (i + 1) for i, t in enumerate(tokens)) % 89) + 10


def D(name: str) -> str:
    """A stand-in digest (64 hex) named for readability."""
    return hashlib.sha256(name.encode()).hexdigest()


def make_block_manager(pages: int) -> BlockManager:
    return BlockManager(FreeListPagePool(pages),
                        CacheABI(base_digest=D("base"), kv_dtype="float32", block_size=BS))


def run_step(sched: Scheduler, generation: int = 0) -> tuple[ScheduleOutput, list[StepUpdate]]:
    out = sched.schedule()
    if out.is_empty:
        return out, []
    plan = build_batch_plan(out.prefills, out.decodes, block_size=BS, generation=generation)
    assert plan.sample_request_ids == tuple(s.request_id for s in out.sampled)
    assert plan.num_rows <= sched.config.max_num_batched_tokens
    assert len(plan.request_ids) <= sched.config.max_num_seqs
    check_invariants(sched)
    tokens = [next_token(s.token_ids) for s in out.sampled]
    return out, sched.postprocess(out, tokens)


def check_invariants(sched: Scheduler) -> None:
    bm = sched.block_manager
    refs = Counter(b for s in sched.running for b in s.block_table)
    for block, n in refs.items():
        assert bm.ref_count(block) == n
    assert all(not s.block_table for s in sched.waiting)
    pool = bm.pool
    assert pool.num_used(PageKind.KV) == bm.num_held_blocks
    assert pool.num_free + pool.num_used(PageKind.KV) == pool.num_pages


def run_to_completion(sched: Scheduler, max_steps: int = 500) -> list[ScheduleOutput]:
    outs = []
    for gen in range(max_steps):
        if not sched.has_unfinished():
            return outs
        out, _ = run_step(sched, gen)
        outs.append(out)
    raise AssertionError("scheduler did not finish")


def reference_output(seq: Sequence) -> list[int]:
    tokens = list(seq.prompt_token_ids)
    for _ in range(seq.sampling.max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(seq.prompt_token_ids):]



def _seq(rid: str, n_prompt: int, max_tokens: int = 4, slot: int = -1, start: int = 1,
         **sp: object) -> Sequence:
    return Sequence(rid, tuple(range(start, start + n_prompt)),
                    SamplingParams(max_tokens=max_tokens, **sp),  # type: ignore[arg-type]
                    adapter_slot=slot, adapter_digest=None if slot < 0 else D(f"sem-{slot}"))


def _sched(pages: int = 64, tokens: int = 64, seqs: int = 8, **kw: object) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=tokens, max_num_seqs=seqs),
                     make_block_manager(pages), **kw)  # type: ignore[arg-type]


def test_all_requests_finish_with_reference_outputs_and_free_blocks() -> None:
    sched = _sched()
    seqs = [_seq(f"r{i}", 3 + 2 * i, max_tokens=5, start=10 * i) for i in range(4)]
    for s in seqs:
        sched.add(s)
    run_to_completion(sched)
    for s in seqs:
        assert s.output_token_ids == reference_output(s)
        assert s.finish_reason is FinishReason.LENGTH and s.block_table == []
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.pool.num_pages


def test_chunked_prefill_and_decode_first_mixing() -> None:
    sched = _sched(tokens=8)
    short = _seq("short", 3, max_tokens=6)
    sched.add(short)
    out, _ = run_step(sched)
    assert [(s.request_id, n) for s, n in out.prefills] == [("short", 3)]
    long = _seq("long", 20, max_tokens=2, start=50)
    sched.add(long)
    out, ups = run_step(sched)  # decode of `short` first, then 7 prompt tokens of `long`
    assert [s.request_id for s in out.decodes] == ["short"]
    assert [(s.request_id, n) for s, n in out.prefills] == [("long", 7)]
    assert [u.seq.request_id for u in ups] == ["short"]  # a partial chunk samples nothing
    out, _ = run_step(sched)
    assert [(s.request_id, n) for s, n in out.prefills] == [("long", 7)]
    out, ups = run_step(sched)
    assert [(s.request_id, n) for s, n in out.prefills] == [("long", 6)]
    assert [u.seq.request_id for u in ups] == ["long", "short"]  # prefills, then decodes
    run_to_completion(sched)
    assert long.output_token_ids == reference_output(long)
    assert short.output_token_ids == reference_output(short)


def test_max_num_seqs_and_fcfs() -> None:
    sched = _sched(seqs=2)
    seqs = [_seq(f"r{i}", 2, max_tokens=3 - (i == 0), start=i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    out, _ = run_step(sched)
    assert [s.request_id for s, _ in out.prefills] == ["r0", "r1"]
    run_step(sched)  # r0 finishes here (2 tokens)
    assert seqs[0].is_finished and seqs[2].status is SequenceStatus.WAITING
    out, _ = run_step(sched)
    assert [s.request_id for s, _ in out.prefills] == ["r2"]
    run_to_completion(sched)


def test_preemption_by_recompute_keeps_outputs() -> None:
    # 6 pages of 4 tokens: two requests of 8 prompt + 12 output tokens cannot both finish.
    sched = _sched(pages=6)
    a, b = _seq("a", 8, max_tokens=12), _seq("b", 8, max_tokens=12, start=40)
    sched.add(a)
    sched.add(b)
    outs = run_to_completion(sched)
    preempted = [s.request_id for o in outs for s in o.preempted]
    assert preempted and set(preempted) == {"b"}  # the later arrival is the victim
    resumed = [n for o in outs for s, n in o.prefills if s.request_id == "b"]
    assert len(resumed) >= 2 and max(resumed) > 8  # recomputed prompt + generated tokens
    assert a.output_token_ids == reference_output(a)
    assert b.output_token_ids == reference_output(b)


def test_not_ready_adapter_gets_no_rows_and_does_not_block() -> None:
    ready = {1: False}
    sched = _sched(adapter_ready=lambda s: ready.get(s.adapter_slot, True))
    cold = _seq("cold", 4, slot=1)
    warm = _seq("warm", 4, slot=2)
    sched.add(cold)
    sched.add(warm)
    out, _ = run_step(sched)
    assert [s.request_id for s, _ in out.prefills] == ["warm"]
    assert cold.block_table == [] and list(sched.waiting) == [cold]
    run_step(sched)
    ready[1] = True
    out, _ = run_step(sched)
    assert [s.request_id for s, _ in out.prefills] == ["cold"]
    ready[1] = False  # a running request whose adapter goes cold pauses, others continue
    out, _ = run_step(sched)
    assert [s.request_id for s in out.decodes] == ["warm"]
    ready[1] = True
    run_to_completion(sched)
    assert cold.output_token_ids == reference_output(cold)


def test_abort_frees_blocks_and_skips_pending_tokens() -> None:
    sched = _sched(pages=8)
    a, b = _seq("a", 5, max_tokens=8), _seq("b", 5, max_tokens=8, start=9)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    out = sched.schedule()
    assert sched.abort("a") is a
    assert a.finish_reason is FinishReason.ABORT and a.block_table == []
    ups = sched.postprocess(out, [7, 7])
    assert [u.seq.request_id for u in ups] == ["b"] and a.num_output_tokens == 1
    assert sched.abort("a") is None and sched.abort("nope") is None
    run_to_completion(sched)
    assert sched.block_manager.num_free_blocks == 8


def test_prefix_hits_same_digest_miss_other_digest() -> None:
    sched = _sched()
    first = _seq("first", 10, max_tokens=1, slot=3)
    sched.add(first)
    run_step(sched)  # prefill computes 10 tokens: blocks [0,4) [4,8) publishable
    same = Sequence("same", first.prompt_token_ids, SamplingParams(max_tokens=1),
                    adapter_slot=5, adapter_digest=D("sem-3"))  # another slot, same semantic digest
    other = _seq("other", 10, max_tokens=1, slot=4)
    sched.add(same)
    sched.add(other)
    out, _ = run_step(sched)
    chunks = {s.request_id: n for s, n in out.prefills}
    assert chunks == {"same": 2, "other": 10}
    assert same.num_cached_tokens == 8 and other.num_cached_tokens == 0
    run_to_completion(sched)
    assert same.output_token_ids == reference_output(same)


def test_stop_token_eos_and_ignore_eos() -> None:
    probe = _seq("probe", 3, max_tokens=3)
    ref = reference_output(probe)
    sched = _sched(eos_token_ids=[ref[1]])
    eos = _seq("eos", 3, max_tokens=3)
    ignore = _seq("ignore", 3, max_tokens=3, ignore_eos=True)
    stop_id = _seq("stopid", 3, max_tokens=3, stop_token_ids=[ref[0]])
    for s in (eos, ignore, stop_id):
        sched.add(s)
    run_to_completion(sched)
    assert eos.output_token_ids == ref[:2] and eos.stop_reason == ref[1]
    assert eos.finish_reason is FinishReason.STOP
    assert ignore.output_token_ids == ref and ignore.finish_reason is FinishReason.LENGTH
    assert stop_id.output_token_ids == ref[:1] and stop_id.stop_reason == ref[0]


class CharDetokenizer:
    """Token id t decodes to chr(t + 87) ('a' for 10): enough to exercise stop strings."""

    def push(self, token_id: int) -> str:
        return chr(token_id + 87)

    def flush(self) -> str:
        return ""


def test_stop_strings_truncate_and_never_stream_partial_stops() -> None:
    probe = _seq("p", 2, max_tokens=6)
    text = "".join(chr(t + 87) for t in reference_output(probe))
    stop = text[2:4]  # spans two tokens
    sched = _sched(detokenizer_factory=lambda _s: CharDetokenizer())
    seq = _seq("s", 2, max_tokens=6, stop=[stop, "never"])
    sched.add(seq)
    streamed = ""
    while sched.has_unfinished():
        _, ups = run_step(sched)
        streamed += "".join(u.text for u in ups)
    assert seq.finish_reason is FinishReason.STOP and seq.stop_reason == stop
    assert seq.output_text == text[: text.find(stop)] == streamed


def test_bad_requests_change_nothing() -> None:
    sched = _sched(pages=4)
    sched.add(_seq("a", 2))
    with pytest.raises(InvalidRequest):
        sched.add(_seq("a", 2))
    with pytest.raises(KVCapacityError):
        sched.add(_seq("huge", 10, max_tokens=10))  # 20 tokens > 16 slots
    with pytest.raises(InvalidRequest):
        sched.add(_seq("stops", 2, stop=["x"]))  # no detokenizer configured
    assert sched.num_unfinished == 1
    out = sched.schedule()
    with pytest.raises(SchedulerError):
        sched.postprocess(out, [])
    with pytest.raises(InvalidRequest):
        SchedulerConfig(max_num_seqs=0)


def test_max_model_len_finishes_with_length() -> None:
    sched = Scheduler(SchedulerConfig(max_model_len=8), make_block_manager(16))
    seq = _seq("r", 5, max_tokens=10)
    sched.add(seq)
    run_to_completion(sched)
    assert seq.num_tokens == 8 and seq.finish_reason is FinishReason.LENGTH
    with pytest.raises(InvalidRequest):
        sched.add(_seq("too-long", 8))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pages=st.integers(8, 24),
    token_budget=st.integers(4, 24),
    max_seqs=st.integers(1, 5),
    requests=st.lists(
        st.tuples(st.integers(1, 14), st.integers(1, 8), st.integers(-1, 2), st.integers(0, 6)),
        min_size=1, max_size=8,
    ),
    events=st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["abort", "cold", "warm"]),
                              st.integers(0, 7)), max_size=6),
)
def test_random_workloads_keep_invariants_and_reference_outputs(
    pages: int, token_budget: int, max_seqs: int,
    requests: list[tuple[int, int, int, int]], events: list[tuple[int, str, int]],
) -> None:
    """Arrivals over time, shared prefixes, adapters going cold and warm, aborts, tiny pools:
    every step's plan is valid and within budget, pages are conserved, and every request
    that was not aborted ends with exactly the reference output."""
    cold: set[int] = set()
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=token_budget, max_num_seqs=max_seqs),
                      make_block_manager(pages), adapter_ready=lambda s: s.adapter_slot not in cold)
    seqs = [_seq(f"r{i}", n, max_tokens=m, slot=slot, start=(i % 2) * 3)
            for i, (n, m, slot, _) in enumerate(requests)]
    arrivals = {i: at for i, (*_, at) in enumerate(requests)}
    aborted: set[str] = set()
    for step in range(400):
        for i, at in arrivals.items():
            if at == step:
                sched.add(seqs[i])
        for at, what, k in events:
            if at == step and what == "abort" and k < len(seqs):
                if sched.abort(seqs[k].request_id) is not None:
                    aborted.add(seqs[k].request_id)
            elif at == step:
                (cold.add if what == "cold" else cold.discard)(k % 3)
        if step > 40:
            cold.clear()  # adapters eventually load
        if step > max(arrivals.values()) and not sched.has_unfinished():
            break
        run_step(sched, step)
    else:
        raise AssertionError("workload did not finish")
    for seq in seqs:
        if seq.request_id not in aborted:
            assert seq.output_token_ids == reference_output(seq)
            assert seq.finish_reason is FinishReason.LENGTH
    bm = sched.block_manager
    assert bm.num_free_blocks == pages and not sched.running and not sched.waiting


def test_abort_of_a_prefill_chunk_between_schedule_and_postprocess() -> None:
    sched = _sched(tokens=6)
    a, b = _seq("a", 4, max_tokens=3), _seq("b", 2, max_tokens=3, start=20)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert [(s.request_id, n) for s, n in out.prefills] == [("a", 4), ("b", 2)]
    assert sched.abort("a") is a
    ups = sched.postprocess(out, [11, 12])  # the engine sampled both rows before the abort
    assert [(u.seq.request_id, u.token_id) for u in ups] == [("b", 12)]
    assert a.num_output_tokens == 0 and b.num_computed_tokens == 2
    run_to_completion(sched)
    assert sched.block_manager.num_free_blocks == 64


def test_a_head_that_cannot_fit_while_nothing_runs_lets_a_smaller_request_run() -> None:
    """Liveness: pool pages held elsewhere (the adapters of the requests queued behind it)
    leave too little for the first waiting request and nothing runs to free any; the first
    ready request that fits is admitted, and the head runs once the pages come back."""
    sched = _sched(pages=8)
    pool = sched.block_manager.pool
    pinned = pool.allocate(4, PageKind.ADAPTER)  # 4 of 8 pages: not obtainable for KV
    head, small = _seq("head", 17, max_tokens=2), _seq("small", 2, max_tokens=2, start=50)
    sched.add(head)
    sched.add(small)
    out = sched.schedule()
    assert [s.request_id for s, _ in out.prefills] == ["small"]
    finished: dict[str, list[int]] = {}
    for _ in range(20):
        if not out.is_empty:
            for u in sched.postprocess(out, [next_token(s.token_ids) for s in out.sampled]):
                if u.finished:
                    finished[u.seq.request_id] = list(u.seq.output_token_ids)
        if "small" in finished and pinned:
            pool.free(pinned, PageKind.ADAPTER)  # its adapter left: the head fits now
            pinned = []
        if len(finished) == 2:
            break
        out = sched.schedule()
    assert finished == {"small": reference_output(small), "head": reference_output(head)}
