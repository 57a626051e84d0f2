"""Page pool: all-or-nothing allocation, owner kinds, conservation after failed calls."""

from __future__ import annotations

import pytest

from dataplane.kvcache import FreeListPagePool, InvalidPageOperation, PageKind, PoolExhausted


def _conserved(pool: FreeListPagePool) -> bool:
    return pool.num_free + sum(pool.num_used(k) for k in PageKind) == pool.num_pages


def test_allocate_and_free_by_owner_kind() -> None:
    pool = FreeListPagePool(8)
    kv = pool.allocate(3, PageKind.KV)
    ad = pool.allocate(2, PageKind.ADAPTER)
    assert len(set(kv) | set(ad)) == 5
    assert (pool.num_free, pool.num_used(PageKind.KV), pool.num_used(PageKind.ADAPTER)) == (3, 3, 2)
    pool.free(kv, PageKind.KV)
    assert pool.num_free == 6 and _conserved(pool)


def test_failures_change_nothing() -> None:
    pool = FreeListPagePool(4)
    kv = pool.allocate(3, PageKind.KV)
    with pytest.raises(PoolExhausted) as exc:
        pool.allocate(2, PageKind.KV)
    assert exc.value.code == "POOL_EXHAUSTED"
    assert pool.num_free == 1
    with pytest.raises(InvalidPageOperation):  # wrong owner kind
        pool.free(kv, PageKind.ADAPTER)
    with pytest.raises(InvalidPageOperation):  # one page not allocated: the whole call fails
        pool.free([kv[0], 3 if 3 not in kv else 0], PageKind.KV)
    with pytest.raises(InvalidPageOperation):
        pool.free([kv[0], kv[0]], PageKind.KV)
    assert pool.num_used(PageKind.KV) == 3 and _conserved(pool)
    pool.free(kv, PageKind.KV)
    with pytest.raises(InvalidPageOperation):  # double free
        pool.free(kv[:1], PageKind.KV)
    assert pool.num_free == 4 and _conserved(pool)
    with pytest.raises(InvalidPageOperation):
        FreeListPagePool(0)
