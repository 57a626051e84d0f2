"""The unified device pool: pages, storage, slots, residencies and their counters.

One object per worker device, owned by the engine loop (single-threaded mutation;
other threads read :attr:`slots.table` snapshots). Load transactions
(:mod:`dataplane.pool.transactions`) and the engine's slot binding
(``dataplane.engine.pool_slots``) act on it; this module holds the shared state and the
small operations both need: KV allocation with eviction, references and pins,
retirement and reclamation, launch snapshots. The cross-structure invariant lives in
:mod:`dataplane.pool.pool_invariants` (:meth:`DevicePool.check`, :meth:`DevicePool.audit`);
counters, gauges and slot listeners in :mod:`dataplane.pool.pool_reporting`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from dataplane.pool.errors import (
    ConservationError,
    IllegalTransition,
    KvCapacityExhausted,
    NotResident,
    PoolError,
)
from dataplane.pool.events import CopyEvent
from dataplane.pool.eviction import choose_victims, ineligibility, is_eligible
from dataplane.pool.faults import FaultInjector
from dataplane.pool.host_tier import HostTier
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.page_pool import AdapterOwner, KvOwner, PagePool, PoolCounts
from dataplane.pool.page_storage import PageStorage
from dataplane.pool.pool_invariants import audit_pool, check_pool
from dataplane.pool.pool_reporting import PoolStats, SlotListener, pool_gauges
from dataplane.pool.residency import VISIBLE, Residency, ResidencyState
from dataplane.pool.slot_table import (
    LaunchRegistry,
    LaunchSnapshot,
    PointerEntry,
    SlotHandle,
    SlotState,
    SlotTable,
)

__all__ = ["DevicePool", "PoolStats", "SlotListener"]

S = ResidencyState


class DevicePool:
    """State of one device's unified pool (see module docstring). ``spare_pages``: storage
    rows after the last page that no page id names (the KV cache's trash block when the
    engine's KV lives in this storage, :mod:`dataplane.pool.unified`)."""

    def __init__(
        self,
        geometry: PageGeometry,
        total_pages: int,
        num_slots: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        *,
        host_tier: HostTier | None = None,
        faults: FaultInjector | None = None,
        slot_generations: Mapping[int, tuple[int, int]] | None = None,
        last_generations: Mapping[str, int] | None = None,
        rehash_on_load: bool = True,
        full_audit: bool = True,
        listeners: Sequence[SlotListener] = (),
        spare_pages: int = 0,
    ) -> None:
        self.geometry = geometry
        self.pages = PagePool(total_pages)
        self.storage = PageStorage(geometry, total_pages, dtype, device, spare_pages=spare_pages)
        self.slots = SlotTable(num_slots, slot_generations)
        self.launches = LaunchRegistry()
        self.host = host_tier if host_tier is not None else HostTier(1 << 40, pin_memory=False)
        self.faults = faults or FaultInjector()
        self.rehash_on_load = rehash_on_load
        self.full_audit = full_audit
        self.listeners = list(listeners)
        self.residents: dict[tuple[str, int], Residency] = {}
        self.tombstones: list[tuple[str, int]] = []
        self._last_gen: dict[str, int] = dict(last_generations or {})
        self._clock = 0
        self.stats = PoolStats()
        self._txn_seq = 0
        self._txn_ids: set[str] = set()

    # ---- identities and clocks ---------------------------------------------------------
    def next_generation(self, key: str) -> int:
        self._last_gen[key] = self._last_gen.get(key, 0) + 1
        return self._last_gen[key]

    def check_attempt_id(self, attempt_id: str | None) -> None:
        """Refuse a load attempt id already used (one id per attempt, never reused)."""
        if attempt_id is not None and (attempt_id in self._txn_ids or not attempt_id):
            raise IllegalTransition(f"load attempt id {attempt_id!r} is empty or was already "
                                    "used", reason="attempt_id_reused")

    def next_txn_id(self, attempt_id: str | None = None) -> str:
        """``attempt_id`` (checked unused) or the next ``txN``."""
        self.check_attempt_id(attempt_id)
        txn = attempt_id
        while txn is None or txn in self._txn_ids:
            self._txn_seq += 1
            txn = f"tx{self._txn_seq}"
        self._txn_ids.add(txn)
        return txn

    def touch(self, res: Residency) -> None:
        self._clock += 1
        res.last_touch = self._clock

    # ---- lookups -----------------------------------------------------------------------
    def visible(self, key: str) -> Residency | None:
        """Newest generation of ``key`` that new requests may bind, if any."""
        found = [r for r in self.residents.values() if r.key == key and r.state in VISIBLE]
        return max(found, key=lambda r: r.generation) if found else None

    def by_slot(self, slot: int) -> Residency:
        for r in self.residents.values():
            if r.slot == slot and r.state in (*VISIBLE, S.RETIRING):
                return r
        raise NotResident(f"no residency in slot {slot}")

    def live_generations(self) -> frozenset[tuple[str, int]]:
        return self.launches.live_generations()

    def refresh_host_sources(self) -> None:
        for r in self.residents.values():
            r.host_source_verified = r.key in self.host

    def candidates(self, exclude_key: str | None = None) -> list[Residency]:
        self.refresh_host_sources()
        return [r for r in self.residents.values() if r.key != exclude_key and r.txn is None]

    def reclaimable_pages(self, exclude_key: str | None = None) -> int:
        """Pages of the residencies a victim search may take now (`is_eligible`). The
        cheap disqualifiers (references, pins, an open transaction) are checked first, so
        a pool whose adapters are all held or pinned answers without the full check."""
        idle = [r for r in self.residents.values()
                if not (r.refcount or r.pin_count or r.txn is not None) and r.key != exclude_key]
        if not idle:
            return 0
        live = self.live_generations()
        for r in idle:
            r.host_source_verified = r.key in self.host
        return sum(len(r.pages) for r in idle if is_eligible(r, live))

    # ---- references, pins, queued reservations -------------------------------------------
    def acquire(self, res: Residency) -> None:
        """One more request attempt bound to ``res`` (refused unless visible)."""
        if res.state not in VISIBLE:
            raise NotResident(f"{res.key}@g{res.generation} is {res.state.value}")
        res.refcount += 1
        self.touch(res)
        res.settle_refcount()

    def release_ref(self, res: Residency, last_use: CopyEvent | None = None) -> None:
        """Drop one reference; ``last_use`` fences device work that may still read it."""
        if res.refcount <= 0:
            raise IllegalTransition(f"{res.key}@g{res.generation} has no references")
        res.refcount -= 1
        if last_use is not None:
            res.note_use(last_use)
        if res.state is S.RETIRING:
            self.try_reclaim(res)
        else:
            res.settle_refcount()

    def pin(self, res: Residency) -> None:
        if res.state not in VISIBLE:
            raise NotResident(f"{res.key}@g{res.generation} is {res.state.value}")
        res.pin_count += 1

    def unpin(self, res: Residency) -> None:
        if res.pin_count <= 0:
            raise IllegalTransition("unpin without pin")
        res.pin_count -= 1
        self.try_reclaim(res)

    def hold_for_queue(self, res: Residency) -> None:
        """A queued request's admission assumes ``res`` stays resident."""
        if res.state not in VISIBLE:
            raise NotResident(f"{res.key}@g{res.generation} is {res.state.value}")
        res.queued_reservations += 1

    def release_queue_hold(self, res: Residency) -> None:
        if res.queued_reservations <= 0:
            raise IllegalTransition("no queued reservation to release")
        res.queued_reservations -= 1
        self.try_reclaim(res)

    # ---- retirement and reclamation --------------------------------------------------------
    def retire(self, res: Residency) -> bool:
        """Stop new binds now; reclaim when every fence clears. Returns True if reclaimed."""
        res.transition(S.RETIRING)
        if res.slot is not None:
            self.slots.retire(res.slot)
        return self.try_reclaim(res)

    def try_reclaim(self, res: Residency) -> bool:
        """RETIRING -> ABSENT once refs, pins, queue holds, events and launches are clear."""
        if res.state is not S.RETIRING or res.txn is not None:
            return False
        if (res.refcount or res.pin_count or res.queued_reservations or res.inflight_events
                or (res.key, res.generation) in self.live_generations()):
            return False
        self._unpublish(res)
        self.pages.release(AdapterOwner(res.key, res.generation))
        self.bury(res)
        return True

    def reclaim_retired(self) -> list[tuple[str, int]]:
        """Poll every retiring residency (call once per engine step)."""
        done = []
        for res in list(self.residents.values()):
            if res.state is S.RETIRING and self.try_reclaim(res):
                done.append((res.key, res.generation))
        return done

    def evict(self, res: Residency) -> None:
        """Retire and reclaim an eligible idle residency now (KV growth pressure)."""
        reason = ineligibility(res, self.live_generations())
        if reason is not None:
            raise IllegalTransition(f"{res.key}@g{res.generation} not evictable: {reason}")
        if not self.retire(res):
            raise ConservationError(f"{res.key}@g{res.generation} eligible but not reclaimed")

    def retire_for_reuse(self, victim: Residency, txn: str) -> None:
        """A proven-eligible victim: retire, unpublish now, hand its pages to ``txn``.

        The caller reserves the pages in the same step; the residency stays listed
        (``retiring``, held by ``txn``) until commit buries it or rollback restores it.
        """
        victim.transition(S.RETIRING)
        if victim.slot is not None:
            self.slots.retire(victim.slot)
        self._unpublish(victim)
        victim.slot = None
        victim.txn = txn

    def notify_publish(self, entry: PointerEntry) -> None:
        for listener in self.listeners:
            listener.on_publish(entry)

    def _unpublish(self, res: Residency) -> None:
        if res.slot is not None and self.slots.state(res.slot) is SlotState.RETIRING:
            self.slots.reclaim(res.slot)
            for listener in self.listeners:
                listener.on_unpublish(res.slot)

    def bury(self, res: Residency) -> None:
        res.transition(S.ABSENT)
        res.pages, res.slot = (), None
        del self.residents[(res.key, res.generation)]
        self.tombstones.append((res.key, res.generation))

    # ---- KV pages ------------------------------------------------------------------------
    def allocate_kv(self, owner: str, n: int, evict: bool = True) -> tuple[int, ...]:
        """``n`` pages for KV owner ``owner``: free pages first, then evict eligible idle
        adapters (LRU); :class:`KvCapacityExhausted` (nothing changed) when impossible."""
        shortfall = n - self.pages.num_free
        if shortfall > 0:
            if not evict:
                raise KvCapacityExhausted(f"{n} pages wanted, {self.pages.num_free} free")
            try:
                victims = choose_victims(self.candidates(), shortfall, self.live_generations())
            except PoolError as exc:
                raise KvCapacityExhausted(f"KV growth of {n} pages: {exc.message}") from exc
            for v in victims:
                self.evict(v)
            self.stats.evictions += len(victims)
        pages = self.pages.allocate(KvOwner(owner), n)
        self.audit()
        return pages

    def free_kv(self, owner: str, pages: Iterable[int] | None = None) -> None:
        self.pages.release(KvOwner(owner), pages)

    # ---- launches ------------------------------------------------------------------------
    def begin_launch(self, handles: Iterable[SlotHandle]) -> LaunchSnapshot:
        """Snapshot the pointer table for a launch; any stale handle refuses the launch."""
        return self.launches.begin(self.slots.table, handles)

    def end_launch(self, snap: LaunchSnapshot, last_use: CopyEvent) -> None:
        self.launches.end(snap, last_use)

    def gauges(self) -> dict[str, dict[str, int]]:
        """Current pages by class, residencies by state, slots by state (for /metrics)."""
        return pool_gauges(self)

    # ---- invariant -----------------------------------------------------------------------
    def check(self) -> PoolCounts:
        """Page conservation plus agreement of residencies, page owners and pointer table.

        The whole pool: every residency and pointer entry (and, with ``full_audit``, every
        page). Tests and debugging call it; transactions call :meth:`audit`.
        """
        return check_pool(self)

    def audit(self, touched: Iterable[Residency] = ()) -> PoolCounts:
        """The per-transaction audit: :meth:`check` in ``full_audit`` mode; otherwise page
        conservation by class counters (O(owners)) plus the residencies in ``touched``
        and their pointer entries (O(pages touched)), so a bind's cost does not grow with
        the number of residents."""
        return audit_pool(self, touched)
