"""Page pool: fixed-size pages handed out to explicit owners (S-LoRA paging).

The pool only counts and names pages; what a page holds is decided by its owner: the KV
block manager (one page = one KV block of `block_size` tokens for every layer) or, in the
unified pool (docs/ARCHITECTURE.md, "The unified pool"), an adapter generation. Every page
records the kind of owner that took it and must be freed under that same kind; pool
conservation `num_free + sum(num_used(kind)) == num_pages` holds after every call, failed or
not.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from dataplane.kvcache.errors import InvalidPageOperation, PoolExhausted


class PageKind(enum.Enum):
    KV = "kv"
    ADAPTER = "adapter"


@runtime_checkable
class PagePool(Protocol):
    """Fixed-size pages identified by ints in [0, num_pages)."""

    @property
    def num_pages(self) -> int: ...

    @property
    def num_free(self) -> int:
        """Pages an allocation can obtain now (a unified pool: free + evictable adapters)."""
        ...

    @property
    def num_free_pages(self) -> int:
        """Pages free right now: an allocation of at most these evicts nothing."""
        ...

    def num_used(self, kind: PageKind) -> int: ...

    def can_allocate(self, n: int) -> bool: ...

    def allocate(self, n: int, kind: PageKind) -> list[int]:
        """Take `n` pages for an owner of `kind`; all or nothing (PoolExhausted)."""
        ...

    def free(self, pages: Iterable[int], kind: PageKind) -> None:
        """Return pages taken under `kind`; all or nothing (InvalidPageOperation)."""
        ...


class FreeListPagePool:
    """Host-side bookkeeping of a device page pool: a FIFO free list plus each page's owner kind.

    Pages freed most recently are reused last, which keeps recently released KV pages (and
    whatever a debugger may want to inspect in them) around longest.
    """

    def __init__(self, num_pages: int) -> None:
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise InvalidPageOperation("num_pages must be an int >= 1", num_pages=num_pages)
        self._num_pages = num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._owner: list[PageKind | None] = [None] * num_pages
        self._used = dict.fromkeys(PageKind, 0)

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def num_used(self, kind: PageKind) -> int:
        return self._used[kind]

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int, kind: PageKind) -> list[int]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidPageOperation("page count must be an int >= 0", n=n)
        if n > len(self._free):
            raise PoolExhausted("not enough free pages", requested=n, free=len(self._free))
        pages = [self._free.popleft() for _ in range(n)]
        for p in pages:
            self._owner[p] = kind
        self._used[kind] += n
        return pages

    def free(self, pages: Iterable[int], kind: PageKind) -> None:
        pages = list(pages)
        if len(set(pages)) != len(pages):
            raise InvalidPageOperation("page freed twice in one call", pages=pages)
        for p in pages:
            if not 0 <= p < self._num_pages or self._owner[p] is not kind:
                raise InvalidPageOperation("page is not allocated to this owner kind",
                                           page=p, kind=kind.value)
        for p in pages:
            self._owner[p] = None
            self._free.append(p)
        self._used[kind] -= len(pages)
