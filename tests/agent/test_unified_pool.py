"""One pool for KV blocks and adapter factors, through the agent's engine ("fill the pool
with adapters then grow KV", "fill with KV then request a cold adapter").

The engine draws KV blocks from the same DevicePool its adapters live in: engine KV block
i is pool page i, and conservation holds across both classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentSettings
from agent.engine_factory import agent_engine
from agent.metrics import AgentMetrics
from dataplane.core import SamplingParams
from dataplane.engine.adapters import AdapterError, AdapterHandle, LoadedAdapter, load_peft_adapter
from dataplane.engine.engine import Engine
from dataplane.engine.observer import EngineObserver
from dataplane.engine.pool_slots import PoolSlots
from dataplane.pool.errors import AdmissionRefused
from dataplane.pool.page_pool import KvOwner, PageClass

from .assets import GreedyReference
from .conftest import AGENT_MAX_RANK, AgentAssets

BLOCK = 4


def _engine(assets: AgentAssets, tmp_path: Path, pages: int) -> tuple[Engine, PoolSlots]:
    settings = AgentSettings(model_dir=assets.base, max_slots=3, max_rank=AGENT_MAX_RANK,
                             num_kv_blocks=pages, block_size=BLOCK, cache_dir=tmp_path)
    engine, _ = agent_engine(settings, AgentMetrics())
    return engine, engine.pool


def _load(engine: Engine, name: str, adapter: LoadedAdapter, kv_pages: int = 0
          ) -> AdapterHandle:
    """As the agent loads: under the artifact's key, evictable, with its waiting KV."""
    return engine.register_loaded_adapter(adapter, key=name, kv_pages=kv_pages,
                                          evictable=True)


class _Evictions(EngineObserver):
    def __init__(self) -> None:
        self.keys: list[str] = []

    def adapter_evicted(self, key: str) -> None:
        self.keys.append(key)


def _kv_pages_are_engine_blocks(engine: Engine, slots: PoolSlots) -> None:
    """Every page the engine's block manager holds is a KV page of the pool, and the
    pool's page ids are the engine's KV block ids (same count)."""
    pool = slots.pool
    counts = pool.check()
    assert counts.free + counts.reserved + counts.adapter + counts.kv == pool.pages.total
    assert engine.config.num_kv_blocks == pool.pages.total
    held = set(pool.pages.pages_of(KvOwner(slots.kv_view.owner)))
    assert held == {p for p in range(pool.pages.total) if pool.pages.class_of(p) is PageClass.KV}
    assert engine.block_manager.num_held_blocks == len(held)


def test_fill_with_adapters_then_grow_kv(agent_assets: AgentAssets,
                                         reference: GreedyReference, tmp_path: Path) -> None:
    engine, slots = _engine(agent_assets, tmp_path, pages=48)
    abi = engine.base_abi
    assert abi is not None
    log = _Evictions()
    engine.observers.append(log)
    evicted = log.keys
    handles: dict[str, AdapterHandle] = {}
    for name in ("b", "a", "c"):
        handles[name] = _load(engine, name, load_peft_adapter(agent_assets.adapters[name], abi,
                                                              AGENT_MAX_RANK))
    slots.hold(handles["b"])  # a live request holds b: never a victim
    counts = slots.pool.pages.counts()
    b_pages = len(slots.pool.visible("b").pages)  # type: ignore[union-attr]
    free = counts.free
    assert counts.adapter > b_pages and free < slots.pool.pages.total - counts.adapter + 1
    # a base request whose KV needs every free page and more: idle adapters give way
    need = slots.pool.pages.total - b_pages - 1
    prompt = [(7 * i) % 250 + 3 for i in range(BLOCK * need - 4)]
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=4,
                                                   ignore_eos=True))[0]
    assert list(out.token_ids) == reference.greedy(prompt, 4, None)
    assert evicted and "b" not in evicted
    assert slots.pool.visible("b") is not None
    for name in evicted:
        assert slots.pool.visible(name) is None
        with pytest.raises(AdapterError):  # the engine no longer binds an evicted handle
            engine.add_request(f"late-{name}", [5, 6], None, handles[name])
    _kv_pages_are_engine_blocks(engine, slots)
    # the held adapter still serves exactly
    ref = reference.greedy([21, 22, 23], 3, "b")
    got = engine.generate([[21, 22, 23]], SamplingParams(temperature=0, max_tokens=3,
                                                         ignore_eos=True), [handles["b"]])
    assert list(got[0].token_ids) == ref
    slots.unhold(handles["b"])
    _kv_pages_are_engine_blocks(engine, slots)


def test_fill_with_kv_then_request_a_cold_adapter(agent_assets: AgentAssets,
                                                  reference: GreedyReference,
                                                  tmp_path: Path) -> None:
    engine, slots = _engine(agent_assets, tmp_path, pages=24)
    abi = engine.base_abi
    assert abi is not None
    b = load_peft_adapter(agent_assets.adapters["b"], abi, AGENT_MAX_RANK)
    prompt = [(5 * i) % 250 + 3 for i in range(BLOCK * 20 - 2)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine.add_request("long", prompt, params)
    engine.step()  # prefill: 20 of 24 pages are this request's KV
    before = (slots.pool.pages.counts(), dict(slots.pool.residents), slots.pool.slots.table)
    with pytest.raises(AdmissionRefused):
        _load(engine, "b", b, kv_pages=1)
    assert (slots.pool.pages.counts(), dict(slots.pool.residents),
            slots.pool.slots.table) == before
    _kv_pages_are_engine_blocks(engine, slots)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.finished]
    assert list(outs[0].token_ids) == reference.greedy(prompt, 6, None)
    # the finished request's blocks sit in the prefix cache (KV pages); the cold load
    # returns just enough of them to the pool and then fits
    handle = _load(engine, "b", b, kv_pages=1)
    assert slots.pool.pages.counts().adapter == len(slots.pool.visible("b").pages)  # type: ignore[union-attr]
    got = engine.generate([[21, 22, 23]], SamplingParams(temperature=0, max_tokens=3,
                                                         ignore_eos=True), [handle])
    assert list(got[0].token_ids) == reference.greedy([21, 22, 23], 3, "b")
    _kv_pages_are_engine_blocks(engine, slots)


def test_one_buffer_holds_kv_and_adapters(agent_assets: AgentAssets,
                                          reference: GreedyReference, tmp_path: Path) -> None:
    """The engine's KV cache is page-major views of the pool's storage: a prefill writes
    exactly its KV pages' bytes (no adapter page), and a mixed batch equals HF + PEFT."""
    engine, slots = _engine(agent_assets, tmp_path, pages=40)
    abi = engine.base_abi
    assert abi is not None
    storage = slots.pool.storage.backing
    cache = engine.runner.cache
    assert cache is slots.kv_cache and cache.pages is not None
    lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes
    for t in (cache.k, cache.v):
        assert t.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr()
        assert lo <= t.data_ptr() and t[-1, -1, -1, -1, -1].data_ptr() < hi
    handles = {n: _load(engine, n, load_peft_adapter(agent_assets.adapters[n], abi,
                                                     AGENT_MAX_RANK)) for n in ("a", "b", "c")}
    adapter_pages = {p for n in handles for p in slots.pool.visible(n).pages}  # type: ignore[union-attr]
    before = storage.clone()
    prompt = [(3 * i) % 250 + 5 for i in range(2 * BLOCK + 1)]
    engine.add_request("one", prompt, SamplingParams(temperature=0, max_tokens=3,
                                                     ignore_eos=True), handles["b"])
    engine.step()  # prefill: K/V of 9 tokens = 3 KV blocks = 3 pool pages, every layer
    changed = {int(p) for p in (storage != before).any(dim=1).nonzero()[:, 0]}
    kv = set(slots.pool.pages.pages_of(KvOwner(slots.kv_view.owner)))
    assert len(changed) == 3 and changed <= kv and not changed & adapter_pages
    while engine.has_unfinished():
        engine.step()

    prompts = [[21, 22, 23], [40, 41, 42, 43, 44, 45], [7, 8, 9, 10, 11], [99, 98]]
    names: list[str | None] = [None, "a", "b", "c"]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    got = engine.generate(prompts, params, [handles[n] if n else None for n in names])
    for prompt, name, g in zip(prompts, names, got, strict=True):
        assert list(g.token_ids) == reference.greedy(prompt, 5, name)
    _kv_pages_are_engine_blocks(engine, slots)
