"""The KV block manager draws its pages from the unified pool through KvPageView."""

from __future__ import annotations

import pytest
import torch

from dataplane.core import Sequence
from dataplane.kvcache import BlockManager, CacheABI, PageKind, PagePool
from dataplane.kvcache.errors import InvalidPageOperation, PoolExhausted
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.host_tier import HostTier
from dataplane.pool.kv_view import KvPageView
from dataplane.pool.page_pool import KvOwner
from dataplane.pool.transactions import LoadRequest, admit

from .builders import SLORA_GEOMETRY, packed

ABI = CacheABI(base_digest="b" * 64, kv_dtype="float16", block_size=4)


def test_block_manager_over_the_unified_pool() -> None:
    host = HostTier(1 << 20, pin_memory=False)
    host.put(packed("a", 0))
    pool = DevicePool(SLORA_GEOMETRY, 16, 2, torch.float16, host_tier=host)
    adm = admit(pool, LoadRequest("a", request_id="r9", kv_initial=1, kv_growth=1))
    view = KvPageView(pool)
    assert isinstance(view, PagePool)
    mgr = BlockManager(view, ABI)
    seq = Sequence("r1", tuple(range(9)))  # 3 blocks
    mgr.allocate(seq)
    assert pool.pages.counts().kv == 2 + 3 and view.num_used(PageKind.ADAPTER) == 4
    assert all(p not in adm.adapter_pages for p in seq.block_table)
    assert view.adopt("r9") == list(adm.kv_pages)
    assert pool.pages.pages_of(KvOwner("r9")) == ()
    pool.check()
    with pytest.raises(InvalidPageOperation):
        view.free(adm.adapter_pages, PageKind.KV)
    with pytest.raises(InvalidPageOperation):
        view.allocate(1, PageKind.ADAPTER)
    with pytest.raises(PoolExhausted):
        view.allocate(view.num_free + 1, PageKind.KV)
    mgr.deallocate(seq)
    assert view.num_used(PageKind.KV) == 2  # the adopted reservation
    view.free(adm.kv_pages, PageKind.KV)
    assert pool.pages.num_free == 12
    pool.check()


def test_kv_growth_reclaims_idle_adapters_but_never_held_ones() -> None:
    host = HostTier(1 << 20, pin_memory=False)
    for i, key in enumerate(("a", "b")):
        host.put(packed(key, i))
    pool = DevicePool(SLORA_GEOMETRY, 16, 2, torch.float16, host_tier=host)
    admit(pool, LoadRequest("a"))
    held = admit(pool, LoadRequest("b", request_id="r-b"))  # r-b holds b
    view = KvPageView(pool, reclaim=True)
    fired: list[int] = []
    view.on_evict.append(lambda: fired.append(pool.stats.evictions))
    assert view.num_free == 8 + 4  # free + a's pages (b is referenced)
    # can_allocate answers from free pages alone when they suffice, and counts the idle
    # adapter's pages only beyond them (never the held one's)
    assert view.can_allocate(8) and view.can_allocate(12) and not view.can_allocate(13)
    assert not view.can_allocate(-1) and pool.visible("a") is not None  # asking evicts nothing
    got = view.allocate(10, PageKind.KV)
    assert fired == [1] and pool.visible("a") is None and pool.visible("b") is not None
    assert set(got).isdisjoint(held.adapter_pages)
    with pytest.raises(PoolExhausted):
        view.allocate(view.num_free + 1, PageKind.KV)
    assert pool.visible("b") is not None
    pool.check()
