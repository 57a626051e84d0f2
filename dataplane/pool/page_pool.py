"""Bookkeeping of one unified page pool: which page is in which state, owned by whom.

``total`` fixed-size pages; each page is in exactly one physical state::

    free | reserved(txn) | adapter(key, generation) | kv(owner)

and the allocator invariant ``free + reserved + adapter + kv == total`` holds after
every public call (each call validates its arguments first and mutates nothing when
it raises). Ownership rules differ by class even though pages come from one free
set: an adapter page belongs to exactly one adapter generation (shared by every
request that leases it, which is counted elsewhere); a KV page belongs to one
request attempt or one prefix-sharing relation (``KvOwner.owner`` names either).

Allocation is deterministic: the lowest free page indices first (so the test
fixtures reproduce exactly). Plain Python, torch-free, single-threaded: the engine
loop owns the pool; readers on other threads use published snapshots instead.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dataplane.pool.errors import ConservationError, PageOwnershipError


class PageClass(enum.Enum):
    FREE = "free"
    RESERVED = "reserved"
    ADAPTER = "adapter"
    KV = "kv"


@dataclass(frozen=True, order=True)
class ReservedBy:
    """Pages held by an open transaction (not yet usable by any reader)."""

    txn: str


@dataclass(frozen=True, order=True)
class AdapterOwner:
    """Pages of one immutable adapter generation (``key`` = artifact digest)."""

    key: str
    generation: int


@dataclass(frozen=True, order=True)
class KvOwner:
    """KV pages of one request attempt or one prefix-sharing relation."""

    owner: str


Owner = ReservedBy | AdapterOwner | KvOwner

_CLASS_OF: dict[type, PageClass] = {
    ReservedBy: PageClass.RESERVED,
    AdapterOwner: PageClass.ADAPTER,
    KvOwner: PageClass.KV,
}


@dataclass(frozen=True)
class PoolCounts:
    """Pages per physical state; ``free + reserved + adapter + kv == total``."""

    free: int
    reserved: int
    adapter: int
    kv: int
    total: int

    def as_dict(self) -> dict[str, int]:
        return {"free": self.free, "reserved": self.reserved, "adapter": self.adapter,
                "kv": self.kv}


class PagePool:
    """Ownership ledger of ``total`` pages (indices ``0 .. total-1``)."""

    def __init__(self, total: int) -> None:
        if not isinstance(total, int) or total <= 0:
            raise ValueError(f"total pages must be a positive int, got {total!r}")
        self.total = total
        self._owner: list[Owner | None] = [None] * total
        self._members: dict[Owner, set[int]] = {}
        self._free_heap: list[int] = list(range(total))
        self._num_free = total
        self._class_count: dict[PageClass, int] = {
            c: 0 for c in PageClass if c is not PageClass.FREE}

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self._num_free

    def owner_of(self, page: int) -> Owner | None:
        self._check_index(page)
        return self._owner[page]

    def class_of(self, page: int) -> PageClass:
        owner = self.owner_of(page)
        return PageClass.FREE if owner is None else _CLASS_OF[type(owner)]

    def pages_of(self, owner: Owner) -> tuple[int, ...]:
        return tuple(sorted(self._members.get(owner, ())))

    def owners(self) -> tuple[Owner, ...]:
        return tuple(sorted(self._members, key=repr))

    def free_pages(self) -> tuple[int, ...]:
        return tuple(p for p in range(self.total) if self._owner[p] is None)

    def counts(self) -> PoolCounts:
        c = self._class_count
        return PoolCounts(self._num_free, c[PageClass.RESERVED], c[PageClass.ADAPTER],
                          c[PageClass.KV], self.total)

    # ---- mutations (validate everything, then mutate) ----------------------------------
    def reserve(self, txn: str, num_free: int,
                take: Sequence[AdapterOwner] = ()) -> tuple[int, ...]:
        """Atomically move ``num_free`` lowest free pages plus every page of the ``take``
        owners (victims already proven eligible and unpublished) to ``reserved(txn)``.

        Returns the reserved pages sorted ascending. Raises without change if there are
        not enough free pages or a victim owns no pages.
        """
        rid = ReservedBy(txn)
        if num_free < 0 or num_free > self._num_free:
            raise PageOwnershipError(f"cannot reserve {num_free} free pages "
                                     f"({self._num_free} free)", txn=txn)
        if rid in self._members:
            raise PageOwnershipError(f"transaction {txn!r} already holds a reservation")
        if len(set(take)) != len(take):
            raise PageOwnershipError("a victim is named twice", txn=txn)
        for victim in take:
            if not isinstance(victim, AdapterOwner) or not self._members.get(victim):
                raise PageOwnershipError(f"victim {victim!r} owns no pages", txn=txn)
        pages = [self._pop_free() for _ in range(num_free)]
        for victim in take:
            pages.extend(self._members[victim])
            self._move(self._members[victim], victim, rid)
        for p in pages[:num_free]:
            self._set(p, rid)
        return tuple(sorted(pages))

    def assign(self, txn: str, pages: Iterable[int], owner: AdapterOwner | KvOwner) -> None:
        """Hand reserved pages of ``txn`` to their final owner (publication / KV commit)."""
        self._transfer(ReservedBy(txn), tuple(pages), owner)

    def transfer(self, src: KvOwner, dst: KvOwner, pages: Iterable[int] | None = None) -> None:
        """Re-own KV pages directly (e.g. a request's committed reservation joining the
        block manager's prefix-sharing relation); they never pass through free."""
        chosen = tuple(self._members.get(src, ())) if pages is None else tuple(pages)
        self._transfer(src, chosen, dst)

    def release_reservation(self, txn: str, pages: Iterable[int] | None = None) -> None:
        """Return reserved pages of ``txn`` (all of them by default) to the free set."""
        rid = ReservedBy(txn)
        chosen = tuple(self._members.get(rid, ())) if pages is None else tuple(pages)
        self._require_held(rid, chosen)
        for p in chosen:
            self._clear(p)

    def allocate(self, owner: KvOwner | AdapterOwner, n: int) -> tuple[int, ...]:
        """Take ``n`` lowest free pages for ``owner`` directly (KV growth)."""
        if n < 0 or n > self._num_free:
            raise PageOwnershipError(f"cannot allocate {n} pages ({self._num_free} free)")
        pages = tuple(self._pop_free() for _ in range(n))
        for p in pages:
            self._set(p, owner)
        return tuple(sorted(pages))

    def release(self, owner: AdapterOwner | KvOwner, pages: Iterable[int] | None = None) -> None:
        """Return ``owner``'s pages (all by default) to the free set."""
        chosen = tuple(self._members.get(owner, ())) if pages is None else tuple(pages)
        self._require_held(owner, chosen)
        for p in chosen:
            self._clear(p)

    # ---- invariant -------------------------------------------------------------------
    def check(self, full: bool = True) -> PoolCounts:
        """Audit conservation. ``full``: every page in exactly one state and the page and
        owner indexes agree (O(pages)); otherwise the class counters are checked against
        the owner index (O(owners)), cheap enough for every KV growth step."""
        if not full:
            return self._check_counts()
        seen: dict[int, Owner] = {}
        for owner, pages in self._members.items():
            for p in pages:
                if p in seen or self._owner[p] != owner:
                    raise ConservationError(f"page {p} claimed by {owner!r} and "
                                            f"{seen.get(p, self._owner[p])!r}")
                seen[p] = owner
        free = sum(1 for o in self._owner if o is None)
        counts = self.counts()
        if (len(seen) + free != self.total or free != counts.free
                or counts.free + counts.reserved + counts.adapter + counts.kv != self.total):
            raise ConservationError(f"conservation broken: {counts} (audited free={free}, "
                                    f"owned={len(seen)})")
        return self._check_counts()

    def _check_counts(self) -> PoolCounts:
        owned = 0
        for cls in (PageClass.RESERVED, PageClass.ADAPTER, PageClass.KV):
            n = sum(len(v) for k, v in self._members.items() if _CLASS_OF[type(k)] is cls)
            if n != self._class_count[cls]:
                raise ConservationError(f"{cls.value} counter {self._class_count[cls]} != {n}")
            owned += n
        counts = self.counts()
        if owned + counts.free != self.total:
            raise ConservationError(f"conservation broken: {counts}")
        return counts

    # ---- internals -------------------------------------------------------------------
    def _check_index(self, page: int) -> None:
        if not isinstance(page, int) or not 0 <= page < self.total:
            raise PageOwnershipError(f"page {page!r} outside [0, {self.total})")

    def _require_held(self, owner: Owner, pages: tuple[int, ...]) -> None:
        held = self._members.get(owner, set())
        if len(set(pages)) != len(pages):
            raise PageOwnershipError("a page is named twice", owner=repr(owner))
        missing = [p for p in pages if p not in held]
        if missing:
            raise PageOwnershipError(f"{owner!r} does not hold pages {missing}")

    def _transfer(self, src: Owner, pages: tuple[int, ...], dst: Owner) -> None:
        self._require_held(src, pages)
        self._move(set(pages), src, dst)

    def _move(self, pages: set[int], src: Owner, dst: Owner) -> None:
        """Re-own ``pages`` (all held by ``src``) without passing through the free set."""
        for p in tuple(pages):
            self._clear(p, to_free=False)
            self._set(p, dst, from_free=False)

    def _pop_free(self) -> int:
        while True:
            p = heapq.heappop(self._free_heap)
            if self._owner[p] is None:
                return p

    def _set(self, page: int, owner: Owner, from_free: bool = True) -> None:
        self._owner[page] = owner
        self._members.setdefault(owner, set()).add(page)
        self._class_count[_CLASS_OF[type(owner)]] += 1
        if from_free:
            self._num_free -= 1

    def _clear(self, page: int, to_free: bool = True) -> None:
        owner = self._owner[page]
        if owner is None:
            raise PageOwnershipError(f"page {page} is already free")
        members = self._members[owner]
        members.discard(page)
        if not members:
            del self._members[owner]
        self._class_count[_CLASS_OF[type(owner)]] -= 1
        self._owner[page] = None
        if to_free:
            self._num_free += 1
            heapq.heappush(self._free_heap, page)
