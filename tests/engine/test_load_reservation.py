"""Loads and KV growth share one page counter (tiny random Llama on CPU): a prefetch never
takes pages the running requests may still grow into, and a load reservation keeps new
admissions off the pages a waiting load needs until running requests free them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.core import InvalidRequest, SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.adapters import load_peft_adapter
from dataplane.engine.engine import Engine
from dataplane.pool.errors import AdmissionRefused

from .helpers import adapter_pages

BS = 4


def _engine(model_dir: Path, adapters: dict[str, Path], kv_blocks: int) -> Engine:
    pages = kv_blocks + adapter_pages(model_dir, adapters, block_size=BS)
    return build_engine(EngineSpec.of(model_dir, max_num_seqs=4, max_num_batched_tokens=64,
                                      num_kv_blocks=pages, block_size=BS, max_slots=2,
                                      max_rank=8, enable_prefix_caching=False))


def test_prefetch_leaves_the_running_requests_growth(tiny_llama: Path,
                                                     tiny_adapters: dict[str, Path]) -> None:
    one = {"attn_r4": tiny_adapters["attn_r4"]}
    engine = _engine(tiny_llama, one, kv_blocks=12)
    assert engine.base_abi is not None
    adapter = load_peft_adapter(one["attn_r4"], engine.base_abi, 8)
    # a running request that may grow to 52 tokens = 13 blocks, more than the 12 KV
    # blocks beside the adapter's pages; 2 held after its prefill
    engine.add_request("long", [5] * 7, SamplingParams(max_tokens=45, ignore_eos=True))
    engine.step()
    growth = engine.scheduler.committed_kv_growth()
    assert growth == 13 - len(engine.scheduler.running[0].block_table)
    free = engine.block_manager.num_free_blocks
    need = adapter_pages(tiny_llama, one, block_size=BS)
    assert free >= need and free - growth < need  # fits now, but only on promised pages
    before = engine.block_manager.num_free_blocks
    with pytest.raises(AdmissionRefused):
        engine.register_loaded_adapter(adapter, evictable=True, prefetch=True)
    assert engine.block_manager.num_free_blocks == before  # refused: nothing changed
    handle = engine.register_loaded_adapter(adapter, evictable=True)  # a demand load may
    assert engine.adapters.bound()[handle.slot] == handle
    while engine.has_unfinished():
        engine.step()


def test_load_reservation_holds_admission_until_running_requests_free_pages(
        tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    engine = _engine(tiny_llama, {}, kv_blocks=16)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("running", [1] * 15, params)  # 4 blocks, grows to 5
    engine.step()
    free = engine.block_manager.num_free_blocks
    engine.reserve_for_loads(free - 2)  # what a waiting load needs
    engine.add_request("new", [2] * 11, params)  # needs 3 blocks: would fit, must wait
    admitted_while_held = []
    while "running" in {s.request_id for s in engine.scheduler.running}:
        engine.step()
        admitted_while_held += [s.request_id for s in engine.scheduler.running]
    assert "new" not in admitted_while_held
    assert engine.block_manager.num_free_blocks >= free - 2 + 3  # the load's pages are free
    engine.reserve_for_loads(0)  # the load was placed: admission resumes
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["new"]
    with pytest.raises(InvalidRequest):
        engine.reserve_for_loads(-1)
    assert engine.scheduler.load_reservation == 0


def test_kv_growth_recycles_cached_blocks_before_evicting_an_idle_adapter(
        tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    """A new request that needs more pages than are free takes the prefix cache's
    unreferenced blocks first: the idle (evictable) adapter stays resident."""
    one = {"attn_r4": tiny_adapters["attn_r4"]}
    pages = 8 + adapter_pages(tiny_llama, one, block_size=BS)
    engine = build_engine(EngineSpec.of(tiny_llama, max_num_seqs=4, max_num_batched_tokens=64,
                                        num_kv_blocks=pages, block_size=BS, max_slots=2,
                                        max_rank=8))
    assert engine.base_abi is not None
    handle = engine.register_loaded_adapter(
        load_peft_adapter(one["attn_r4"], engine.base_abi, 8), evictable=True)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    engine.generate([[3] * 24], params)  # leaves 6 full blocks in the prefix cache
    bm = engine.block_manager
    free_now, cached = bm.pool.num_free_pages, bm.cache.num_evictable
    need = 5  # a 16-token prompt + its first token
    assert cached >= need - free_now > 0 and bm.pool.can_allocate(need)  # both could serve
    engine.generate([[9] * 16], params)
    assert engine.adapters.bound().get(handle.slot) == handle  # not evicted
