"""The agent's engine (its unified pool and launch fences) under async scheduling.

Async is forced on CPU (the agent's default there is synchronous). Launch fences are
counted through the real :class:`PoolSlots`, wrapped only to record its calls: every
`begin_launch` gets exactly one `end_launch`, in launch order, and with async steps two
fences really are open at once. References: the synchronous engine, and HF transformers
+ PEFT greedy decoding for the hot-swapped request.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.config import AgentSettings
from agent.engine_factory import agent_engine
from agent.metrics import AgentMetrics
from dataplane.core import SamplingParams
from dataplane.engine.adapters import AdapterError, AdapterHandle, load_peft_adapter
from dataplane.engine.engine import Engine
from dataplane.engine.pool_slots import PoolSlots
from dataplane.pool.errors import StaleGeneration
from dataplane.pool.residency import ResidencyState
from dataplane.pool.slot_table import LaunchSnapshot

from .assets import GreedyReference
from .conftest import AGENT_MAX_RANK, AgentAssets


@dataclass(eq=False)
class Counted:
    """One begin_launch as the engine sees it: the real snapshot (None: no adapter slot)."""

    snap: LaunchSnapshot | None


class CountingSlots:
    """The real PoolSlots; begin/end_launch calls are recorded on their way through."""

    def __init__(self, real: PoolSlots) -> None:
        self.real = real
        self.begun: list[Counted] = []
        self.ended: list[Counted] = []
        self.open: list[Counted] = []
        self.max_open = 0

    def begin_launch(self, row_slots: tuple[int, ...]) -> Counted:
        launch = Counted(self.real.begin_launch(row_slots))
        self.begun.append(launch)
        self.open.append(launch)
        self.max_open = max(self.max_open, len(self.open))
        return launch

    def end_launch(self, launch: Counted) -> None:
        assert launch in self.open, "end_launch of a launch that is not open"
        self.open.remove(launch)
        self.ended.append(launch)
        self.real.end_launch(launch.snap)

    def open_generations(self) -> set[tuple[str, int]]:
        return {g for c in self.open if c.snap is not None for g in c.snap.generations}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _engine(assets: AgentAssets, tmp_path: Path, *, async_on: bool
            ) -> tuple[Engine, PoolSlots, CountingSlots]:
    settings = AgentSettings(model_dir=assets.base, max_slots=3, max_rank=AGENT_MAX_RANK,
                             num_kv_blocks=64, block_size=4, max_num_seqs=4,
                             max_num_batched_tokens=32, cache_dir=tmp_path)
    engine, _ = agent_engine(settings, AgentMetrics())
    assert engine.async_scheduling is False  # the agent's default on CPU
    real = engine.pool
    counting = CountingSlots(real)
    engine.pool = counting  # type: ignore[assignment]
    engine.async_scheduling = async_on
    return engine, real, counting


def _load(engine: Engine, slots: PoolSlots, assets: AgentAssets,
          name: str) -> AdapterHandle:
    abi = engine.base_abi
    assert abi is not None
    return engine.register_loaded_adapter(
        load_peft_adapter(assets.adapters[name], abi, AGENT_MAX_RANK), key=name, evictable=True)


def _balanced(counting: CountingSlots, slots: PoolSlots) -> None:
    """Every begin_launch had exactly one end_launch, in launch order; nothing is live."""
    assert counting.begun and counting.open == []
    assert counting.ended == counting.begun  # identity (eq=False): each once, in order
    assert slots.pool.live_generations() == frozenset()
    slots.pool.check()


GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def _drive(engine: Engine, handles: dict[str, AdapterHandle],
           reqs: list[tuple[str, list[int], SamplingParams, str | None, int]],
           abort: tuple[str, int] | None) -> dict[str, Any]:
    """Add requests at their step call, abort one, step until done; finals + streams."""
    finals: dict[str, Any] = {}
    streamed: dict[str, list[int]] = {}
    call = 0
    while call <= max(r[4] for r in reqs) or engine.has_unfinished():
        for rid, prompt, params, adapter, arrive in reqs:
            if arrive == call:
                engine.add_request(rid, prompt, params, handles[adapter] if adapter else None)
        if abort is not None and abort[1] == call:
            assert engine.abort(abort[0])
        for out in engine.step():
            streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finals[out.request_id] = out
        call += 1
        assert call < 200
    return {"finals": finals, "streamed": streamed}


def test_async_agent_engine_matches_sync_and_fences_every_launch(
        agent_assets: AgentAssets, reference: GreedyReference, tmp_path: Path) -> None:
    seeded = SamplingParams(temperature=0.9, top_k=50, seed=11, max_tokens=8,
                            ignore_eos=True, logprobs=1)
    reqs = [("ra", [21, 22, 23], GREEDY, "a", 0),
            ("rb", [5, 6, 7, 8, 9], seeded, "b", 0),
            ("base", [40, 41], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
             None, 2),
            ("victim", [70, 71, 72, 73], GREEDY, "c", 1),
            ("rc", [90, 91, 92], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
             "c", 6)]
    runs = {}
    for async_on in (False, True):
        engine, slots, counting = _engine(agent_assets, tmp_path, async_on=async_on)
        handles = {n: _load(engine, slots, agent_assets, n) for n in ("a", "b", "c")}
        free = engine.block_manager.num_free_blocks
        runs[async_on] = _drive(engine, handles, reqs, abort=("victim", 5))
        _balanced(counting, slots)
        assert engine.block_manager.num_free_blocks == free
        # sync: one fence at a time; async: the next step's fence opens before this one ends
        assert counting.max_open == (2 if async_on else 1)
        assert (engine.num_overlapped_steps > 0) is async_on
    sync, asyn = runs[False], runs[True]
    assert set(sync["finals"]) == set(asyn["finals"]) == {"ra", "rb", "base", "rc"}
    for rid, want in sync["finals"].items():
        got = asyn["finals"][rid]
        assert got.token_ids == want.token_ids, rid
        assert asyn["streamed"][rid] == list(got.token_ids), rid
        assert got.finish_reason == want.finish_reason == "length", rid
    for a, b in zip(sync["finals"]["rb"].logprobs, asyn["finals"]["rb"].logprobs, strict=True):
        assert a.token_id == b.token_id and [t for t, _ in a.top] == [t for t, _ in b.top]
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
    assert list(asyn["finals"]["ra"].token_ids) == reference.greedy([21, 22, 23], 10, "a")
    victim = reference.greedy([70, 71, 72, 73], 10, "c")  # aborted: streamed a prefix
    for run in (sync, asyn):
        part = run["streamed"].get("victim", [])
        assert 0 < len(part) < 10 and part == victim[:len(part)]


def _step_until_in_flight(engine: Engine, counting: CountingSlots,
                          generations: set[tuple[str, int]]) -> list[int]:
    """Step until a launched, unretired plan reads every generation in `generations`."""
    tokens: list[int] = []
    for _ in range(10):
        for out in engine.step():
            tokens.extend(out.new_token_ids)
        if generations <= counting.open_generations():
            return tokens
    raise AssertionError("no step stayed in flight")


def _generation(slots: PoolSlots, key: str) -> tuple[str, int]:
    """The (key, residency generation) of `key`'s one visible residency."""
    (found,) = [k for k, r in slots.pool.residents.items()
                if k[0] == key and r.state is not ResidencyState.RETIRING]
    return found


def _gone(slots: PoolSlots, gen: tuple[str, int]) -> bool:
    res = slots.pool.residents.get(gen)
    return res is None or res.state is ResidencyState.ABSENT


def test_hot_swap_during_async_steps_never_reclaims_an_in_flight_slot(
        agent_assets: AgentAssets, reference: GreedyReference, tmp_path: Path) -> None:
    engine, slots, counting = _engine(agent_assets, tmp_path, async_on=True)
    handles = {n: _load(engine, slots, agent_assets, n) for n in ("a", "b", "c")}
    gen = {n: _generation(slots, n) for n in ("a", "b", "c")}
    prompts = {"R": [21, 22, 23], "S": [30, 31, 32, 33]}
    engine.add_request("R", prompts["R"], GREEDY, handles["a"])
    engine.add_request("S", prompts["S"], GREEDY, handles["b"])
    streamed: dict[str, list[int]] = {"R": [], "S": []}

    def step() -> None:
        for out in engine.step():
            streamed[out.request_id].extend(out.new_token_ids)

    for _ in range(10):  # until a launched, unretired step reads both a and b
        step()
        if {gen["a"], gen["b"]} <= counting.open_generations():
            break
    assert {gen["a"], gen["b"]} <= counting.open_generations()
    # Only the launch fence protects the slots here: R's pool reference on a is dropped and
    # a is unloaded through the pool itself (the engine refuses to unregister an adapter a
    # live request uses).
    stale = slots.pool_handle(handles["a"])
    with pytest.raises(AdapterError, match="live requests"):
        engine.unregister_adapter(handles["a"])
    slots.unhold(handles["a"])
    slots.unload(handles["a"])  # hot swap, step 1: unload while R runs
    assert slots.pool.residents[gen["a"]].state is ResidencyState.RETIRING  # not reclaimed
    # A load under slot pressure may evict only the idle adapter: c, never a (retiring
    # but fenced) nor b (read by the in-flight step).
    handles["d"] = _load(engine, slots, agent_assets, "d")
    assert handles["d"].slot == handles["c"].slot and _gone(slots, gen["c"])
    assert slots.pool.residents[gen["a"]].state is ResidencyState.RETIRING
    assert not _gone(slots, gen["b"])
    slots.pool.check()
    before = len(streamed["R"])
    step()  # applies the step that read a; R has no adapter now, so gets no new row
    assert len(streamed["R"]) == before + 1
    assert gen["a"] not in counting.open_generations() and _gone(slots, gen["a"])
    with pytest.raises(StaleGeneration):  # a's old handle never validates again
        slots.pool.begin_launch([stale])
    step()
    assert len(streamed["R"]) == before + 1  # R waits for its adapter
    # Hot swap, step 2: reload a; it takes its old slot under a new generation, R resumes.
    handles["a2"] = _load(engine, slots, agent_assets, "a")
    assert handles["a2"].slot == handles["a"].slot and handles["a2"] != handles["a"]
    assert _generation(slots, "a") != gen["a"]
    while engine.has_unfinished():
        step()
    assert streamed["R"] == reference.greedy(prompts["R"], 10, "a")
    assert streamed["S"] == reference.greedy(prompts["S"], 10, "b")
    assert engine.num_overlapped_steps > 0
    _balanced(counting, slots)


def test_aborts_mid_flight_leak_no_fence(agent_assets: AgentAssets,
                                         reference: GreedyReference, tmp_path: Path) -> None:
    engine, slots, counting = _engine(agent_assets, tmp_path, async_on=True)
    handles = {n: _load(engine, slots, agent_assets, n) for n in ("a", "b", "c")}
    gen = {n: _generation(slots, n) for n in ("a", "b")}
    free = engine.block_manager.num_free_blocks
    engine.add_request("R", [21, 22, 23], GREEDY, handles["a"])
    engine.add_request("S", [30, 31, 32, 33], GREEDY, handles["b"])
    for _ in range(10):
        engine.step()
        if {gen["a"], gen["b"]} <= counting.open_generations():
            break
    assert len(counting.open) == 1 and {gen["a"], gen["b"]} <= counting.open_generations()
    assert engine.abort("R")
    assert len(counting.open) == 1  # S still needs the in-flight step
    assert engine.abort("S")
    # Nothing left to apply: the plan is retired by the abort, no further step() needed
    # (the agent's loop stops stepping once nothing is unfinished).
    assert not engine.has_unfinished() and counting.open == []
    assert slots.pool.live_generations() == frozenset()
    engine.unregister_adapter(handles["a"])
    engine.unregister_adapter(handles["b"])
    assert _gone(slots, gen["a"]) and _gone(slots, gen["b"])  # reclaimed at once
    assert engine.block_manager.num_free_blocks == free
    out = engine.generate([[90, 91, 92]], SamplingParams(temperature=0, max_tokens=5,
                                                         ignore_eos=True), [handles["c"]])
    assert list(out[0].token_ids) == reference.greedy([90, 91, 92], 5, "c")
    _balanced(counting, slots)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_agent_engine_is_async_by_default_on_cuda(agent_assets: AgentAssets,
                                                  reference: GreedyReference,
                                                  tmp_path: Path) -> None:
    """On CUDA the agent's pool engine captures graphs after attaching the pool and runs
    async by default; a hot swap mid-flight keeps the fenced slot until the step's
    recorded event completes. Tokens equal HF + PEFT."""
    settings = AgentSettings(model_dir=agent_assets.base, max_slots=3,
                             max_rank=AGENT_MAX_RANK, num_kv_blocks=64, block_size=4,
                             max_num_seqs=4, max_num_batched_tokens=32, cache_dir=tmp_path,
                             device="cuda")
    engine, _ = agent_engine(settings, AgentMetrics())
    assert engine.runner.graphs is not None and engine.async_scheduling is True
    real = engine.pool
    counting = CountingSlots(real)
    engine.pool = counting  # type: ignore[assignment]
    handles = {n: _load(engine, real, agent_assets, n) for n in ("a", "b", "c")}
    gen_a = _generation(real, "a")
    prompts = {"R": [21, 22, 23], "S": [30, 31, 32, 33], "T": [40, 41]}
    for rid, name in (("R", "a"), ("S", "b"), ("T", None)):
        engine.add_request(rid, prompts[rid], GREEDY, handles[name] if name else None)
    streamed: dict[str, list[int]] = {rid: [] for rid in prompts}

    def step() -> None:
        for out in engine.step():
            streamed[out.request_id].extend(out.new_token_ids)

    for _ in range(10):
        step()
        if gen_a in counting.open_generations():
            break
    assert gen_a in counting.open_generations()
    engine.unregister_adapter(handles["a"])
    assert not _gone(real, gen_a)  # fenced by the in-flight step
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    real.pool.reclaim_retired()
    assert _gone(real, gen_a)
    handles["a"] = _load(engine, real, agent_assets, "a")
    while engine.has_unfinished():
        step()
    assert engine.num_overlapped_steps > 0
    assert engine.runner.graphs.replays > 0  # type: ignore[attr-defined]
    for rid, name in (("R", "a"), ("S", "b"), ("T", None)):
        assert streamed[rid] == reference.greedy(prompts[rid], 10, name), rid
    torch.cuda.synchronize()
    _balanced(counting, real)
