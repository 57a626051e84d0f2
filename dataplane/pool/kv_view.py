"""The KV block manager's view of the unified pool (``dataplane.kvcache.page_pool.PagePool``).

The block manager draws and returns KV pages through the small ``PagePool`` protocol
(``allocate(n, kind)`` / ``free(pages, kind)``). :class:`KvPageView` implements it over a
:class:`DevicePool`: KV pages it hands out are owned by one KV owner (``owner``, the
block manager's prefix-sharing relation), adapter pages are never handed out here
(they come only from load transactions), and conservation is audited by the device
pool. Pages an admission transaction reserved for a request (``KvOwner(request_id)``)
join the block manager through :meth:`adopt`.

With ``reclaim=True`` (the agent's unified pool) KV growth may evict eligible idle
adapters (no refs, pins, queued reservations, in-flight events or live launches; LRU):
``num_free`` then counts free + reclaimable pages, and :meth:`allocate` goes through
:meth:`DevicePool.allocate_kv`. ``on_evict`` callbacks run after an allocation that
evicted adapters, so their owner can drop its bindings (slot listeners have already
seen the unpublication).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dataplane.kvcache.errors import InvalidPageOperation, PoolExhausted
from dataplane.kvcache.page_pool import PageKind
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import PoolError
from dataplane.pool.page_pool import AdapterOwner, KvOwner, PageClass


class KvPageView:
    """``PagePool`` protocol over a device pool; KV pages are owned by ``KvOwner(owner)``."""

    def __init__(self, pool: DevicePool, owner: str = "kv-blocks", *,
                 reclaim: bool = False) -> None:
        self.pool = pool
        self.owner = owner
        self.reclaim = reclaim
        self.on_evict: list[Callable[[], None]] = []

    @property
    def num_pages(self) -> int:
        return self.pool.pages.total

    @property
    def num_free(self) -> int:
        """Pages a KV allocation can obtain now (free, plus reclaimable when ``reclaim``)."""
        free = self.pool.pages.num_free
        return free + self.pool.reclaimable_pages() if self.reclaim else free

    @property
    def num_free_pages(self) -> int:
        """Free pages (an allocation of at most these evicts no adapter)."""
        return self.pool.pages.num_free

    def num_used(self, kind: PageKind) -> int:
        counts = self.pool.pages.counts()
        return counts.kv if kind is PageKind.KV else counts.adapter

    def can_allocate(self, n: int) -> bool:
        """`n <= num_free`, without the scan of reclaimable adapters when free pages do."""
        return n >= 0 and (n <= self.pool.pages.num_free or n <= self.num_free)

    def allocate(self, n: int, kind: PageKind) -> list[int]:
        if kind is not PageKind.KV:
            raise InvalidPageOperation("adapter pages come only from load transactions")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidPageOperation("page count must be an int >= 0", n=n)
        if not self.can_allocate(n):
            raise PoolExhausted("not enough free pages", requested=n, free=self.num_free)
        if not self.reclaim or n <= self.pool.pages.num_free:
            return list(self.pool.pages.allocate(KvOwner(self.owner), n))
        before = self.pool.stats.evictions
        try:
            pages = self.pool.allocate_kv(self.owner, n, evict=True)
        except PoolError as exc:
            raise PoolExhausted(exc.message, requested=n) from exc
        if self.pool.stats.evictions != before:
            for callback in self.on_evict:
                callback()
        return list(pages)

    def free(self, pages: Iterable[int], kind: PageKind) -> None:
        pages = list(pages)
        if kind is not PageKind.KV:
            raise InvalidPageOperation("adapter pages are reclaimed by retirement only")
        try:
            self.pool.pages.release(KvOwner(self.owner), pages)
        except PoolError as exc:
            raise InvalidPageOperation(exc.message, pages=pages) from exc

    def adopt(self, request_id: str) -> list[int]:
        """Move the KV pages an admission committed to ``request_id`` under this view."""
        src = KvOwner(request_id)
        pages = self.pool.pages.pages_of(src)
        self.pool.pages.transfer(src, KvOwner(self.owner), pages)
        return list(pages)

    def kind_of(self, page: int) -> PageKind | None:
        cls = self.pool.pages.class_of(page)
        if cls is PageClass.KV:
            return PageKind.KV
        owner = self.pool.pages.owner_of(page)
        return PageKind.ADAPTER if isinstance(owner, AdapterOwner) else None
