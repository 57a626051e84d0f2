"""One buffer for KV blocks and adapter factors: the KV cache is page-major views of the
pool's storage (KV block p = page p), so KV writes change only the writing request's KV
pages and adapter loads change only the pages the ledger gave them — never a live
request's KV."""

from __future__ import annotations

import pytest
import torch

from dataplane.kvcache import PageKind
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import AdmissionRefused, LayoutError
from dataplane.pool.host_tier import HostTier
from dataplane.pool.kv_view import KvPageView
from dataplane.pool.transactions import LoadRequest, admit
from dataplane.pool.unified import KV_SPARE_PAGES, kv_cache_on, unified_layout

from .builders import packed

LAYERS, BS, HKV, D, HIDDEN = 2, 2, 1, 4, 8
PAGES = 16
LAYOUT = unified_layout(PAGES, num_layers=LAYERS, block_size=BS, num_kv_heads=HKV,
                        head_dim=D, widest_row=HIDDEN, elem_bytes=2)


def _pool(*keys: str) -> DevicePool:
    host = HostTier(1 << 20, pin_memory=False)
    for i, key in enumerate(keys):
        host.put(packed(key, i, LAYOUT.geometry, hidden=HIDDEN, layers=LAYERS))
    return DevicePool(LAYOUT.geometry, PAGES, 2, torch.float16, host_tier=host,
                      spare_pages=KV_SPARE_PAGES)


def _write_kv(pool: DevicePool, pages: list[int], seed: int) -> None:
    """Write K and V of every token of `pages` (KV blocks) in every layer."""
    cache = kv_cache_on(pool.storage, LAYOUT)
    slots = torch.tensor([p * BS + o for p in pages for o in range(BS)])
    gen = torch.Generator().manual_seed(seed)
    for layer in range(LAYERS):
        k, v = (torch.randn(len(slots), HKV, D, generator=gen).half() for _ in range(2))
        cache.write(layer, slots, k, v)


def _changed_pages(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    return {int(p) for p in (before != after).any(dim=1).nonzero()[:, 0]}


def test_kv_cache_is_views_of_the_pool_storage() -> None:
    pool = _pool()
    cache = kv_cache_on(pool.storage, LAYOUT)
    backing = pool.storage.backing
    assert LAYOUT.geometry.page_elems == LAYOUT.kv_block_elems == 2 * LAYERS * BS * HKV * D
    assert backing.shape == (PAGES + KV_SPARE_PAGES, LAYOUT.geometry.page_elems)
    assert cache.num_blocks == PAGES and cache.dtype == backing.dtype == torch.float16
    lo, hi = backing.data_ptr(), backing.data_ptr() + backing.nbytes
    for t in (cache.k, cache.v):
        assert t.untyped_storage().data_ptr() == backing.untyped_storage().data_ptr()
        assert lo <= t.data_ptr() and t[-1, -1, -1, -1, -1].data_ptr() < hi
    assert pool.storage.flat.data_ptr() == lo and pool.storage.flat.numel() == \
        PAGES * LAYOUT.geometry.page_elems  # adapters never address the spare row
    assert LAYOUT.device_bytes() == {"pages": PAGES * LAYOUT.geometry.page_bytes,
                                     "spare": LAYOUT.geometry.page_bytes}
    with pytest.raises(LayoutError):  # no spare row for the trash block
        kv_cache_on(DevicePool(LAYOUT.geometry, PAGES, 1, torch.float16).storage, LAYOUT)


def test_kv_writes_and_adapter_loads_touch_only_their_own_pages() -> None:
    pool = _pool("a", "b", "c")
    view = KvPageView(pool, reclaim=True)
    live = view.allocate(3, PageKind.KV)  # a live request's KV blocks
    a = admit(pool, LoadRequest("a"))
    a_bytes = pool.storage.read(a.adapter_pages).clone()
    assert a.adapter_pages and not set(a.adapter_pages) & set(live)

    before = pool.storage.backing.clone()
    _write_kv(pool, live, seed=1)
    assert _changed_pages(before, pool.storage.backing) == set(live)
    assert torch.equal(pool.storage.read(a.adapter_pages), a_bytes)

    # a second adapter fills free pages; the live KV pages keep their bytes
    before = pool.storage.backing.clone()
    b = admit(pool, LoadRequest("b"))
    assert _changed_pages(before, pool.storage.backing) <= set(b.adapter_pages)
    assert torch.equal(pool.storage.backing[live], before[live])

    # KV grows into every free page, then past them: the idle adapters are evicted
    grown = view.allocate(PAGES - len(live), PageKind.KV)
    assert set(a.adapter_pages) | set(b.adapter_pages) <= set(grown)
    assert pool.visible("a") is None and pool.visible("b") is None
    before = pool.storage.backing.clone()
    _write_kv(pool, grown, seed=2)
    assert _changed_pages(before, pool.storage.backing) == set(grown)
    assert torch.equal(pool.storage.backing[live], before[live])

    # the pool is all KV now: a cold load is refused and writes nothing
    before = pool.storage.backing.clone()
    with pytest.raises(AdmissionRefused):
        admit(pool, LoadRequest("c"))
    assert torch.equal(pool.storage.backing, before)
    pool.check()

    # the grown KV ends: c loads into those pages, the live request's KV is untouched
    view.free(grown, PageKind.KV)
    c = admit(pool, LoadRequest("c"))
    assert not set(c.adapter_pages) & set(live)
    assert torch.equal(pool.storage.backing[live], before[live])
    assert torch.equal(pool.storage.read(c.adapter_pages),
                       pool.host.peek("c").payload)  # type: ignore[union-attr]
    pool.check()
