"""The LoRA fold over the agent's unified pool (dataplane/pool/fold_source.py): fold slots
are filled from the adapters' pages (batched copy jobs or torch gathers, the same bytes),
emptied when their slot is published anew or reclaimed, and the pool agent's folded decode
steps give HF + PEFT's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent.config import AgentSettings
from agent.engine_factory import agent_engine
from agent.metrics import AgentMetrics
from dataplane.core import SamplingParams
from dataplane.engine.adapters import (
    AdapterError,
    AdapterHandle,
    LoadedAdapter,
    load_peft_adapter,
)
from dataplane.engine.engine import Engine
from dataplane.engine.observer import EngineObserver
from dataplane.engine.pool_slots import PoolSlots
from dataplane.layers.lora_fold_slots import FoldSlots
from dataplane.models.llama import LORA_GROUPS

from .assets import GreedyReference
from .conftest import AGENT_MAX_RANK, AgentAssets

BLOCK = 4
PARAMS = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


def _engine(assets: AgentAssets, tmp_path: Path, **extra: object
            ) -> tuple[Engine, PoolSlots, FoldSlots]:
    settings = AgentSettings(model_dir=assets.base, max_slots=3, max_rank=AGENT_MAX_RANK,
                             num_kv_blocks=64, block_size=BLOCK, cache_dir=tmp_path,
                             max_num_seqs=2, max_num_batched_tokens=32,
                             # arrival order: batches rotate adapters through the fold
                             # slots (the fair policy's cost vector would cluster them)
                             scheduling_policy="fcfs",
                             **{"lora_fold": "on", **extra})  # type: ignore[arg-type]
    engine, _ = agent_engine(settings, AgentMetrics())
    fold = engine.model.lora_fold_slots
    assert fold is not None
    return engine, engine.pool, fold


def _put(engine: Engine, assets: AgentAssets, name: str) -> AdapterHandle:
    """As the agent loads: under the artifact's key, evictable."""
    assert engine.base_abi is not None
    adapter = load_peft_adapter(assets.adapters[name], engine.base_abi, AGENT_MAX_RANK)
    return engine.register_loaded_adapter(adapter, key=name, evictable=True)


def _load(engine: Engine, assets: AgentAssets, name: str) -> tuple[LoadedAdapter, int]:
    assert engine.base_abi is not None
    adapter = load_peft_adapter(assets.adapters[name], engine.base_abi, AGENT_MAX_RANK)
    return adapter, engine.register_loaded_adapter(adapter, key=name, evictable=True).slot


class _Evictions(EngineObserver):
    def __init__(self) -> None:
        self.keys: list[str] = []

    def adapter_evicted(self, key: str) -> None:
        self.keys.append(key)


def _assert_fold_slot_holds(engine: Engine, fold_slot: int,
                            adapter: LoadedAdapter) -> None:
    """Every projection's fold slot holds the adapter's PEFT factors (A rows, B
    transposed, scale), zero past each slice's rank and in slices it does not adapt."""
    modules = {(m.layer, m.module): m for m in adapter.modules}
    for layer, attr, linear in engine.model.lora_linears():
        store = linear.fold
        assert store is not None
        tail = store.weight_aug[store.base_rows:].view(store.hot_slots, len(store.widths),
                                                       store.rank, -1)
        for k, name in enumerate(LORA_GROUPS[attr]):
            a, b, scale = tail[fold_slot, k], store.b[k][fold_slot], store.scale[fold_slot, k]
            m = modules.get((layer, name))
            r = 0 if m is None else m.a.shape[0]
            if m is not None:
                assert torch.equal(a[:r], m.a.to(a.dtype)), (layer, name)
                assert torch.equal(b[:r], m.b.t().to(b.dtype)), (layer, name)
            assert not a[r:].any() and not b[r:].any(), (layer, name)
            assert float(scale) == (0.0 if m is None else float(m.scale)), (layer, name)


def test_pool_agent_folds_decode_steps_and_matches_hf_peft(
        agent_assets: AgentAssets, reference: GreedyReference, tmp_path: Path) -> None:
    """`lora_fold=on`: two fold slots for three resident adapters, so decode steps keep
    copying adapters in from their pages."""
    engine, _slots, fold = _engine(agent_assets, tmp_path)
    assert fold.fold_slots == 2 and engine.model.lora_fold_rows == 2
    handles = {n: _put(engine, agent_assets, n) for n in ("a", "b", "c")}
    prompts = [[21, 22, 23], [40, 41, 42, 43], [7, 8, 9, 10, 11], [99, 98], [5, 6, 7],
               [60, 61]]
    names: list[str | None] = ["a", "b", "c", None, "c", "a"]
    got = engine.generate(prompts, PARAMS, [handles[n] if n else None for n in names])
    for prompt, name, out in zip(prompts, names, got, strict=True):
        assert list(out.token_ids) == reference.greedy(prompt, 5, name), name
    assert fold.copied > len(handles)  # fold slots were taken over
    assert all(linear.fold is not None and linear.fold.uses > 0
               for _l, _a, linear in engine.model.lora_linears())
    assert engine.adapters.kernel_family.endswith("+fold")
    # its own device bytes: per projection, 2 fold slots x slices x rank-8 rows of A
    # (d_in wide) and of B (the slice's width), and one float32 scale per slot and slice
    want = sum(2 * 8 * (len(linear.out_features) * linear.in_features
                        + sum(linear.out_features)) * 4 + 2 * len(linear.out_features) * 4
               for _l, _a, linear in engine.model.lora_linears())
    assert fold.resident_bytes == want


@pytest.mark.parametrize("batched", [False, True])
def test_fold_slots_hold_the_pages_factors(agent_assets: AgentAssets, tmp_path: Path,
                                           batched: bool) -> None:
    """Torch gathers and the batched copy jobs (the Triton interpreter here) copy the
    same bytes: each adapter's factors, exact, over whatever the fold slot held."""
    engine, _slots, fold = _engine(agent_assets, tmp_path)
    fold.batched = batched
    loaded = [_load(engine, agent_assets, n) for n in ("b", "a", "c")]
    by_slot = {slot: adapter for adapter, slot in loaded}
    b, a, c = (slot for _adapter, slot in loaded)
    for step in ([b, -1, a], [c], [a, b], [c, a]):
        rows = fold.rows(step)
        for table_slot, fold_slot in zip(step, rows, strict=True):
            if table_slot >= 0:
                _assert_fold_slot_holds(engine, fold_slot, by_slot[table_slot])
    assert fold.copied >= 5


def test_a_slot_published_anew_is_copied_in_again(
        agent_assets: AgentAssets, reference: GreedyReference, tmp_path: Path) -> None:
    """The fold holds a's slot; a is unloaded and d is published in the same slot: the
    fold slot is emptied, so d's request reads d's factors, not a's."""
    engine, _slots, fold = _engine(agent_assets, tmp_path)
    assert engine.base_abi is not None
    handles = {n: _put(engine, agent_assets, n) for n in ("a", "b", "c")}
    prompt = [30, 31, 32]
    out = engine.generate([prompt], PARAMS, [handles["a"]])[0]
    assert list(out.token_ids) == reference.greedy(prompt, 5, "a")
    held = fold.holder(handles["a"].slot)
    assert held >= 0
    engine.unregister_adapter(handles["a"])
    assert fold.holder(handles["a"].slot) == -1  # reclaimed: the fold let it go
    d = _put(engine, agent_assets, "d")
    assert d.slot == handles["a"].slot
    copied = fold.copied
    out = engine.generate([prompt], PARAMS, [d])[0]
    assert list(out.token_ids) == reference.greedy(prompt, 5, "d")
    assert fold.copied == copied + 1


def test_fold_off_and_after_loads(agent_assets: AgentAssets, tmp_path: Path) -> None:
    settings = AgentSettings(model_dir=agent_assets.base, max_slots=3,
                             max_rank=AGENT_MAX_RANK, num_kv_blocks=64, block_size=BLOCK,
                             cache_dir=tmp_path, lora_fold="off")
    engine, _ = agent_engine(settings, AgentMetrics())
    slots = engine.pool
    assert engine.model.lora_fold_slots is None
    _load(engine, agent_assets, "a")
    with pytest.raises(AdapterError, match="before loading adapters"):
        slots.enable_fold()
    assert engine.model.lora_fold_slots is None
    assert all(linear.fold is None for _l, _a, linear in engine.model.lora_linears())


def test_an_adapter_evicted_for_kv_leaves_the_fold(
        agent_assets: AgentAssets, reference: GreedyReference, tmp_path: Path) -> None:
    """KV growth evicts idle adapters the fold still holds: their fold slots are emptied
    with the reclaim, and an adapter loaded into a freed slot serves its own tokens."""
    engine, slots, fold = _engine(agent_assets, tmp_path)
    assert engine.base_abi is not None
    log = _Evictions()
    engine.observers.append(log)
    evicted = log.keys
    handles = {n: _put(engine, agent_assets, n) for n in ("a", "b", "c")}
    prompt = [30, 31, 32]
    got = engine.generate([prompt, prompt], PARAMS, [handles["a"], handles["c"]])
    assert [list(o.token_ids) for o in got] == [reference.greedy(prompt, 5, n)
                                                for n in ("a", "c")]
    held = {n: fold.holder(h.slot) for n, h in handles.items()}
    assert held["a"] >= 0 and held["c"] >= 0
    adapter_pages = slots.pool.pages.counts().adapter
    need = slots.pool.pages.total - 2  # a base request whose KV needs nearly every page
    long = [(7 * i) % 250 + 3 for i in range(BLOCK * need - 4)]
    out = engine.generate([long], SamplingParams(temperature=0, max_tokens=2,
                                                 ignore_eos=True))[0]
    assert list(out.token_ids) == reference.greedy(long, 2, None)
    assert evicted and slots.pool.pages.counts().adapter < adapter_pages
    for name in evicted:
        assert fold.holder(handles[name].slot) == -1
    d = _put(engine, agent_assets, "d")
    assert d.slot in {handles[n].slot for n in evicted}  # a slot an evicted adapter freed
    slots.hold(d)  # as the agent does while a request runs: never a victim meanwhile
    out = engine.generate([prompt], PARAMS, [d])[0]
    slots.unhold(d)
    assert list(out.token_ids) == reference.greedy(prompt, 5, "d")
