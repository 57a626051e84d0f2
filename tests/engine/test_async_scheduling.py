"""Async scheduling (the next step launched before this step's tokens reach the host)
gives exactly the synchronous engine's outputs and block accounting, on CPU.

The workload mixes staggered arrivals, adapters, greedy with logprobs, seeded sampling,
stop tokens and stop strings that hit mid-batch (chosen from an unstopped reference run so
they really fire), max_tokens, an abort while a step is in flight, and a KV pool small
enough to preempt; requests arriving mid-run are admitted into continuation steps beside
decodes whose input is the previous step's placeholder. Both runs use the same engine;
only `async_scheduling` differs. The second variant runs decode steps through
`CudaGraphRunner`'s static buffers (eagerly on CPU) so the staging + device-to-device
input-id path is exercised too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from dataplane.artifacts import read_base_abi
from dataplane.core import PLACEHOLDER_TOKEN, BatchPlan, SamplingParams
from dataplane.engine.cuda_graphs import CudaGraphRunner
from dataplane.engine.engine import Engine, EngineConfig, RequestOutput
from dataplane.engine.observer import EngineObserver
from dataplane.models import load_model
from dataplane.tokenizer import Tokenizer

from .helpers import adapter_pages

VOCAB = 256
ADAPTERS = ("attn_r4", "all_r8", "mlp_rs2")


def _tokenizer() -> Tokenizer:
    """Token i decodes to a distinct 2-letter word; words are joined by spaces."""
    words = {f"{chr(97 + i // 26)}{chr(97 + i % 26)}": i for i in range(VOCAB)}
    return Tokenizer(HFTokenizer(WordLevel(words, unk_token="aa")), special_tokens={},
                     eos_token_ids=[2], chat_template=None)


def _engine(model_dir: Path, adapters: dict[str, Path], *, async_on: bool, graphs: bool,
            num_kv_blocks: int, cls: type[Engine] = Engine) -> tuple[Engine, dict[str, object]]:
    pages = num_kv_blocks + adapter_pages(model_dir, adapters, block_size=4)  # KV + adapters
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16,
                          num_kv_blocks=pages, block_size=4, max_slots=3, max_rank=8,
                          sampler_seed=5, async_scheduling=async_on)
    abi = read_base_abi(model_dir)
    model = load_model(model_dir, torch.float32, torch.device("cpu"))
    engine = cls(model, config, abi.h_base, abi, _tokenizer())
    if graphs:
        engine.runner.graphs = CudaGraphRunner(engine.runner, 4, 64, batch_sizes=(1, 2, 4),
                                               run_eagerly=True)
    return engine, {n: engine.register_adapter(p) for n, p in adapters.items()}


@dataclass
class Req:
    rid: str
    prompt: list[int]
    params: SamplingParams
    adapter: str | None
    arrive: int  # step() call before which it is added


@dataclass
class Run:
    finals: dict[str, RequestOutput] = field(default_factory=dict)
    streamed: dict[str, list[int]] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    preemptions: int = 0
    overlapped: int = 0
    discarded: int = 0
    mixed_continuations: int = 0
    """Plans with prefill rows and placeholder decode rows (launched before the previous
    step's tokens reached the host)."""


class MixedCounter(EngineObserver):
    def __init__(self) -> None:
        self.plans = 0

    def plan_launched(self, plan: BatchPlan, slot_ranks: dict[int, int]) -> None:
        self.plans += plan.doff > 0 and PLACEHOLDER_TOKEN in plan.input_ids[plan.doff:]


def _drive(engine: Engine, handles: dict[str, object], reqs: list[Req],
           abort: tuple[str, int] | None) -> Run:
    run = Run()
    mixed = MixedCounter()
    engine.observers.append(mixed)
    free_at_start = engine.block_manager.num_free_blocks
    call = 0
    while call <= max(r.arrive for r in reqs) or engine.has_unfinished():
        for r in reqs:
            if r.arrive == call:
                engine.add_request(r.rid, r.prompt, r.params,
                                   handles[r.adapter] if r.adapter else None)  # type: ignore[arg-type]
        if abort is not None and abort[1] == call:
            assert engine.abort(abort[0])
        for out in engine.step():
            run.streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
            run.text[out.request_id] = run.text.get(out.request_id, "") + out.new_text
            if out.finished:
                run.finals[out.request_id] = out
        call += 1
        assert call < 500
    assert engine.block_manager.num_free_blocks == free_at_start  # no leaked blocks
    bm = engine.block_manager  # every block still held is an evictable prefix-cache entry
    assert bm.num_held_blocks == bm.cache.num_evictable
    run.preemptions, run.overlapped = engine.num_preemptions, engine.num_overlapped_steps
    run.discarded = engine.num_discarded_rows
    run.mixed_continuations = mixed.plans
    return run


def _workload(stop_token: int, stop_text: str) -> list[Req]:
    greedy_lp = SamplingParams(temperature=0, max_tokens=12, logprobs=2, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=77, max_tokens=10,
                            ignore_eos=True, logprobs=0)
    return [
        Req("g0", [5, 17, 33, 9, 100, 7], greedy_lp, "all_r8", 0),
        Req("s0", [1, 2, 3], seeded, None, 0),
        Req("stoptok", [9, 9, 9, 31, 200], SamplingParams(
            temperature=0, max_tokens=12, stop_token_ids=(stop_token,), ignore_eos=True),
            "attn_r4", 0),
        Req("short", [60, 61, 62], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
            "mlp_rs2", 1),
        Req("stopstr", [3, 141, 59, 26], SamplingParams(
            temperature=0, max_tokens=12, stop=(stop_text,), ignore_eos=True), None, 2),
        Req("victim", [8, 6, 7, 5, 3, 0, 9], SamplingParams(temperature=0, max_tokens=12,
                                                            ignore_eos=True), "attn_r4", 2),
        Req("s1", [42] * 9, SamplingParams(temperature=1.0, seed=3, max_tokens=9,
                                          ignore_eos=True), "all_r8", 5),
        Req("late", [250, 1, 4], SamplingParams(temperature=0, max_tokens=6, logprobs=1,
                                                ignore_eos=True), "mlp_rs2", 7),
    ]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-buffers"])
def test_async_matches_sync(tiny_llama: Path, tiny_adapters: dict[str, Path],
                            graphs: bool) -> None:
    # Unstopped greedy reference (sync, roomy pool) to pick stops that fire mid-generation.
    engine, handles = _engine(tiny_llama, tiny_adapters, async_on=False, graphs=False,
                              num_kv_blocks=64)
    probe = _drive(engine, handles, _workload(stop_token=VOCAB + 1, stop_text="\x00"), None)
    toks = probe.finals["stoptok"].token_ids  # a token first generated at index >= 6
    stop_token = next(t for i, t in enumerate(toks) if i >= 6 and t not in toks[:i])
    words = probe.finals["stopstr"].text.split(" ")
    stop_text = f"{words[8]} {words[9][0]}"  # spans two tokens
    reqs = _workload(stop_token, stop_text)
    runs = {}
    for async_on in (False, True):
        engine, handles = _engine(tiny_llama, tiny_adapters, async_on=async_on, graphs=graphs,
                                  num_kv_blocks=9)
        assert engine.async_scheduling is async_on
        runs[async_on] = _drive(engine, handles, reqs, abort=("victim", 6))
        if graphs:
            assert engine.runner.graphs.replays > 0  # type: ignore[attr-defined]
    sync, asyn = runs[False], runs[True]
    # The scenario really exercises what it claims to.
    assert sync.preemptions > 0 and asyn.preemptions > 0
    assert asyn.overlapped > 0 and asyn.discarded > 0 and sync.overlapped == 0
    assert asyn.mixed_continuations > 0 and sync.mixed_continuations == 0
    assert sync.finals["stoptok"].finish_reason == "stop"
    assert sync.finals["stoptok"].token_ids[-1] == stop_token
    assert sync.finals["stopstr"].finish_reason == "stop"
    assert sync.finals["short"].finish_reason == "length"
    assert "victim" not in sync.finals and "victim" not in asyn.finals
    assert set(sync.finals) == set(asyn.finals) == {r.rid for r in reqs} - {"victim"}
    for rid, want in sync.finals.items():
        got = asyn.finals[rid]
        assert got.token_ids == want.token_ids, rid
        assert (got.text, got.finish_reason) == (want.text, want.finish_reason), rid
        assert asyn.streamed[rid] == list(got.token_ids) and asyn.text[rid] == got.text, rid
        assert (want.logprobs is None) == (got.logprobs is None), rid
        for a, b in zip(want.logprobs or (), got.logprobs or (), strict=True):
            assert a.token_id == b.token_id and [t for t, _ in a.top] == [t for t, _ in b.top]
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
    # The aborted request streamed a prefix of what it generates when left alone.
    alone, handles = _engine(tiny_llama, tiny_adapters, async_on=False, graphs=False,
                             num_kv_blocks=64)
    victim = next(r for r in reqs if r.rid == "victim")
    ref = _drive(alone, handles, [Req("victim", victim.prompt, victim.params, victim.adapter,
                                      0)], None).finals["victim"].token_ids
    for run in (sync, asyn):
        part = run.streamed.get("victim", [])
        assert list(ref[:len(part)]) == part


def test_async_config_and_subclass_guard(tiny_llama: Path) -> None:
    auto, _ = _engine(tiny_llama, {}, async_on=None, graphs=False,  # type: ignore[arg-type]
                      num_kv_blocks=16)
    assert auto.async_scheduling is False  # CPU without CUDA graphs: synchronous

    class Observing(Engine):
        def build_plan(self, out):  # type: ignore[no-untyped-def]
            return super().build_plan(out)

    abi = read_base_abi(tiny_llama)
    model = load_model(tiny_llama, torch.float32, torch.device("cpu"))
    from dataplane.core import InvalidRequest

    with pytest.raises(InvalidRequest, match="async_scheduling"):
        Observing(model, EngineConfig(max_slots=0, async_scheduling=True), abi.h_base)
    assert not Observing(model, EngineConfig(max_slots=0), abi.h_base).async_scheduling
    # Observers through the plan hooks keep async scheduling (default: off on CPU).
    assert Hooked(model, EngineConfig(max_slots=0, async_scheduling=True),
                  abi.h_base).async_scheduling
    assert not Hooked(model, EngineConfig(max_slots=0), abi.h_base).async_scheduling


def test_abort_while_a_step_is_in_flight(tiny_llama: Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    finals = {}
    for async_on in (False, True):
        engine, _ = _engine(tiny_llama, {}, async_on=async_on, graphs=False, num_kv_blocks=16)
        engine.add_request("keep", [5, 6, 7], params)
        engine.add_request("drop", [8, 9, 10, 11], params)
        streamed: dict[str, list[int]] = {"keep": [], "drop": []}
        for _ in range(3):
            for out in engine.step():
                streamed[out.request_id].extend(out.new_token_ids)
        assert (engine._inflight is not None) is async_on  # the next step is running
        assert engine.abort("drop")
        while engine.has_unfinished():
            for out in engine.step():
                assert out.request_id == "keep"
                streamed["keep"].extend(out.new_token_ids)
        assert streamed["drop"] == streamed["drop"][:3] and len(streamed["drop"]) == 3
        assert engine.block_manager.num_free_blocks == 16
        finals[async_on] = streamed
    assert finals[True] == finals[False]


class Refused(Exception):
    """What Hooked.on_plan_launched raises to refuse one continuation launch."""


class Hooked(Engine):
    """An observer/fence through the public plan hooks: numbers plans, records calls.
    With `refuse_from` set, the first continuation plan (launched while another plan is
    open) numbered at least that is refused once (the hook raises)."""

    refuse_from: int | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.calls = 0
        self.launched: list[int] = []
        self.retired: list[int] = []
        self.refused: list[int] = []
        self.max_open = 0
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    @property
    def open(self) -> list[int]:
        return [t for t in self.launched if t not in self.retired]

    def on_plan_launched(self, plan):  # type: ignore[no-untyped-def]
        self.calls += 1
        if (self.refuse_from is not None and not self.refused and self.open
                and self.calls >= self.refuse_from):
            assert plan.num_prefills == 0  # a continuation: decode rows only
            self.refused.append(self.calls)
            raise Refused(self.calls)
        fence = super().on_plan_launched(plan)  # the engine's own fence over its pool
        self.launched.append(self.calls)
        self.max_open = max(self.max_open, len(self.open))
        return self.calls, fence

    def on_plan_retired(self, token):  # type: ignore[no-untyped-def]
        number, fence = token
        assert number in self.launched and number not in self.retired
        self.retired.append(number)
        super().on_plan_retired(fence)


class FailingRunner:
    """The engine's real ModelRunner; the first `execute` of a continuation plan (decode
    rows fed from the previous step's tokens) after `after` calls raises (a launch that
    fails after on_plan_launched issued its token)."""

    def __init__(self, real: object, after: int) -> None:
        self.real: Any = real
        self.after, self.calls, self.failed = after, 0, 0

    def execute(self, plan, deferred=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        if deferred is not None and not self.failed and self.calls >= self.after:
            self.failed = self.calls
            raise Refused("device launch failed")
        return self.real.execute(plan, deferred)

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


def _drive_tolerant(engine: Engine, handles: dict[str, object], reqs: list[Req]
                    ) -> tuple[dict[str, tuple[int, ...]], int]:
    """Like _drive without abort, but a step that raises is counted and stepping goes on
    (final token ids only: a failed step's outputs are lost to the caller)."""
    finals: dict[str, tuple[int, ...]] = {}
    call = failures = 0
    while call <= max(r.arrive for r in reqs) or engine.has_unfinished():
        for r in reqs:
            if r.arrive == call:
                engine.add_request(r.rid, r.prompt, r.params,
                                   handles[r.adapter] if r.adapter else None)  # type: ignore[arg-type]
        try:
            outs = engine.step()
        except Refused:
            failures += 1
            outs = []
        assert isinstance(engine, Hooked) and len(engine.open) <= 1  # between calls
        finals.update({o.request_id: o.token_ids for o in outs if o.finished})
        call += 1
        assert call < 500
    return finals, failures


def test_plan_hooks_once_per_plan_in_order_also_when_a_launch_is_refused(
        tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    reqs = _workload(stop_token=VOCAB + 1, stop_text="\x00")
    plain, handles = _engine(tiny_llama, tiny_adapters, async_on=False, graphs=False,
                             num_kv_blocks=12)
    want = {rid: o.token_ids for rid, o in _drive(plain, handles, reqs, None).finals.items()}
    for async_on, refuse, fail in ((False, None, None), (True, None, None), (True, 6, None),
                                   (True, None, 6)):
        engine, handles = _engine(tiny_llama, tiny_adapters, async_on=async_on,
                                  graphs=False, num_kv_blocks=12, cls=Hooked)
        assert isinstance(engine, Hooked) and engine.async_scheduling is async_on
        engine.refuse_from = refuse
        if fail is not None:
            engine.runner = FailingRunner(engine.runner, fail)  # type: ignore[assignment]
        got, failures = _drive_tolerant(engine, handles, reqs)
        assert got == want, (async_on, refuse, fail)
        assert failures == (refuse is not None or fail is not None)
        assert len(engine.refused) == (refuse is not None)
        assert fail is None or engine.runner.failed  # type: ignore[attr-defined]
        assert engine.retired == engine.launched == sorted(engine.launched)
        assert engine.max_open == (2 if async_on else 1)
        assert (engine.num_overlapped_steps > 0) is async_on
        bm = engine.block_manager  # no leaked blocks: held ones are evictable cache entries
        assert bm.num_free_blocks == 12 and bm.num_held_blocks == bm.cache.num_evictable
        assert not engine.pool.pool.launches.live_generations()  # every fence closed


def test_abort_retires_the_in_flight_plan_at_once(tiny_llama: Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine, _ = _engine(tiny_llama, {}, async_on=True, graphs=False, num_kv_blocks=16,
                        cls=Hooked)
    assert isinstance(engine, Hooked)
    engine.add_request("x", [5, 6, 7], params)
    engine.add_request("y", [8, 9, 10, 11], params)
    for _ in range(3):
        engine.step()
    assert len(engine.open) == 1  # the next step is in flight
    assert engine.abort("x") and len(engine.open) == 1  # y still needs it
    assert engine.abort("y") and engine.open == []  # nothing to apply: retired now
    assert engine.step() == [] and engine.last_step_idle
    assert engine.retired == engine.launched and engine.block_manager.num_free_blocks == 16
