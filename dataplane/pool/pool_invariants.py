"""The device pool's cross-structure invariant: page conservation plus agreement of
residencies, page owners and the pointer table.

:func:`check_pool` walks the whole pool (tests and debugging); :func:`audit_pool` is the
per-transaction audit, bounded by what the transaction touched unless the pool is in
``full_audit`` mode. Both raise :class:`~dataplane.pool.errors.ConservationError` on the
first disagreement and change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from dataplane.pool.errors import ConservationError
from dataplane.pool.page_pool import AdapterOwner, KvOwner, PoolCounts, ReservedBy
from dataplane.pool.residency import HAS_PAGES, Residency
from dataplane.pool.slot_table import PointerEntry

if TYPE_CHECKING:
    from dataplane.pool.device_pool import DevicePool


def check_pool(pool: DevicePool) -> PoolCounts:
    """Every residency and pointer entry (and, with ``full_audit``, every page)."""
    counts = pool.pages.check(full=pool.full_audit)
    for res in pool.residents.values():
        check_residency(pool, res)
    for owner in pool.pages.owners():
        if isinstance(owner, AdapterOwner) and (
            (owner.key, owner.generation) not in pool.residents
        ):
            raise ConservationError(f"{owner!r} owns pages but has no residency")
    for slot, entry in pool.slots.table.entries.items():
        check_entry(pool, slot, entry)
    return counts


def audit_pool(pool: DevicePool, touched: Iterable[Residency] = ()) -> PoolCounts:
    """:func:`check_pool` in ``full_audit`` mode; otherwise page conservation by class
    counters (O(owners)) plus the residencies in ``touched`` and their pointer entries
    (O(pages touched)), so a bind's cost does not grow with the number of residents."""
    if pool.full_audit:
        return pool.check()
    counts = pool.pages.check(full=False)
    for res in touched:
        if pool.residents.get((res.key, res.generation)) is not res:
            if pool.pages.pages_of(AdapterOwner(res.key, res.generation)):
                raise ConservationError(f"{res.key}@g{res.generation} is gone but owns "
                                        "pages")
            continue
        check_residency(pool, res)
        entry = pool.slots.table.entries.get(res.slot) if res.slot is not None else None
        if entry is not None:
            check_entry(pool, res.slot, entry)  # type: ignore[arg-type]
    return counts


def check_residency(pool: DevicePool, res: Residency) -> None:
    """A listed residency holds pages, exactly its owner's (a subset while in a txn)."""
    if res.state not in HAS_PAGES:
        raise ConservationError(f"{res.key}@g{res.generation} {res.state.value} listed")
    owner: ReservedBy | AdapterOwner | KvOwner = (
        ReservedBy(res.txn) if res.txn else AdapterOwner(res.key, res.generation))
    held = set(pool.pages.pages_of(owner))
    ok = set(res.pages) <= held if res.txn else set(res.pages) == held
    if not ok or not res.pages:
        raise ConservationError(f"{res.key}@g{res.generation} pages {res.pages} "
                                f"disagree with {owner!r} {sorted(held)}")


def check_entry(pool: DevicePool, slot: int, entry: PointerEntry) -> None:
    """A pointer entry names the live residency in ``slot`` and exactly its pages."""
    named = pool.residents.get((entry.key, entry.residency_generation))
    if named is None or named.slot != slot or named.pages != entry.pages:
        raise ConservationError(f"pointer entry of slot {slot} names no live pages")
