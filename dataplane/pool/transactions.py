"""Load/admission transactions: reserve -> copy -> validate -> publish, or roll back.

One :class:`LoadTransaction` admits one request (or a
prefetch / hotswap staging, with no request) against the joint page demand::

    begin()       validate the host source (bytes digest), derive demand, prove the
                  inequality, choose eligible victims (LRU), retire + unpublish them,
                  atomically reserve free + victim pages, stage a slot
    start_copy()  copy the verified payload into the adapter pages; record the event
    finish()      wait for the event, validate (layout, content, zero tails), publish
                  one pointer-table generation, bind the request, commit its KV pages,
                  free the surplus, bury the victims
    abort()       (any failure before publication) wait for in-flight events, drop the
                  staged slot and the new residency, release the KV reservation,
                  reload every victim from its verified host copy into its own pages
                  under a fresh generation, free the rest

The pool audit (:meth:`DevicePool.audit`) runs after the reservation, every commit and
every rollback: the whole pool in ``full_audit`` mode (tests, debugging), else page
conservation by counters plus the residencies this transaction touched.
A failure after publication is not rolled back: recovery is a new generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import (
    AdmissionRefused,
    IllegalTransition,
    InjectedFault,
    PoolError,
    PublishBeforeCopy,
    RestoreFailed,
)
from dataplane.pool.events import CopyEvent, HeldEvent
from dataplane.pool.eviction import choose_victims, is_eligible
from dataplane.pool.faults import FaultAction, FaultPoint
from dataplane.pool.packing import PackedAdapter
from dataplane.pool.page_demand import AdmissionDemand, check_admission
from dataplane.pool.page_pool import AdapterOwner, KvOwner
from dataplane.pool.page_storage import drop_staging
from dataplane.pool.residency import Residency, ResidencyState
from dataplane.pool.rollback import publish_residency, restore_victim, verified_host_source
from dataplane.pool.slot_table import SlotHandle

S = ResidencyState


@dataclass(frozen=True)
class LoadRequest:
    """What to make resident, and for whom. ``request_id=None`` = prefetch / staging."""

    key: str
    request_id: str | None = None
    kv_initial: int = 0
    kv_growth: int = 0
    guard: int = 0
    slot: int | None = None
    fresh: bool = False
    """Load a new generation even if one is visible (post-publication recovery)."""
    attempt_id: str | None = None
    """Unique id of this load attempt (the transaction id); a reuse is refused."""


@dataclass(frozen=True)
class Admission:
    """Outcome of a committed transaction."""

    txn: str
    key: str
    generation: int
    handle: SlotHandle
    adapter_pages: tuple[int, ...]
    kv_pages: tuple[int, ...]
    victims: tuple[tuple[str, int], ...]
    loaded: bool


@dataclass
class LoadTransaction:
    pool: DevicePool
    request: LoadRequest
    txn: str = ""
    phase: str = "new"
    packed: PackedAdapter | None = None
    target: Residency | None = None
    new: Residency | None = None
    victims: list[Residency] = field(default_factory=list)
    reserved: tuple[int, ...] = ()
    kv_pages: tuple[int, ...] = ()
    event: CopyEvent | None = None
    restored: list[tuple[str, int]] = field(default_factory=list)

    # ---- step 1 ------------------------------------------------------------------------
    def begin(self) -> None:
        """Everything up to the atomic reservation; raises with nothing changed."""
        self._expect("new")
        pool, req = self.pool, self.request
        pool.check_attempt_id(req.attempt_id)
        self.target = None if req.fresh else pool.visible(req.key)
        if self.target is None:
            self.packed = verified_host_source(pool, req.key)
        incremental = 0 if self.target else self.packed.num_pages if self.packed else 0
        demand = AdmissionDemand(incremental, req.kv_initial, req.kv_growth, req.guard)
        free = pool.pages.num_free
        live = pool.live_generations()
        candidates = [r for r in pool.candidates(req.key) if r is not self.target]
        check_admission(free, sum(len(r.pages) for r in candidates if is_eligible(r, live)),
                        demand)
        victims = choose_victims(candidates, demand.total - free, live)
        if self.target is None:
            if req.slot is None and not pool.slots.free_slots() and not victims:
                spare = [r for r in candidates if is_eligible(r, live)]
                if not spare:
                    raise AdmissionRefused("every adapter slot is busy", reason="no_free_slot")
                victims = choose_victims(spare, 1, live)
            elif req.slot is not None and req.slot not in pool.slots.free_slots():
                raise IllegalTransition(f"slot {req.slot} is not free", slot=req.slot)
        # ---- mutation starts: nothing above changed any state ----
        self.txn = pool.next_txn_id(req.attempt_id)
        if self.target is not None:
            pool.hold_for_queue(self.target)  # keeps it resident until commit or abort
        for v in victims:
            pool.retire_for_reuse(v, self.txn)
        self.victims = victims
        victim_pages = sum(len(v.pages) for v in victims)
        self.reserved = pool.pages.reserve(
            self.txn, max(0, demand.committed - victim_pages),
            [AdapterOwner(v.key, v.generation) for v in victims])
        adapter_pages = self.reserved[:incremental]
        self.kv_pages = self.reserved[incremental : incremental + demand.kv_pages]
        if self.target is None:
            slot = pool.slots.reserve(req.slot)
            self.new = Residency(req.key, pool.next_generation(req.key), slot=slot,
                                 txn=self.txn, host_source_verified=True)
            self.new.transition(S.HOST_READY)
            self.new.transition(S.RESERVED)
            self.new.pages = adapter_pages
            pool.residents[(req.key, self.new.generation)] = self.new
        self.phase = "reserved"
        pool.audit(self._touched())

    # ---- step 2 ------------------------------------------------------------------------
    def start_copy(self) -> None:
        self._expect("reserved")
        if self.new is None or self.packed is None:
            self.phase = "copied"
            return
        self.new.transition(S.LOADING)
        self.phase = "copying"
        spec = self.pool.faults.take(FaultPoint.COPY)
        pages, payload = self.new.pages, self.packed.payload
        if spec is not None and spec.action is FaultAction.FAIL:
            k = min(spec.after_pages, len(pages))
            self.new.note_use(self.pool.storage.copy_in(pages[:k], payload[:k]))
            raise InjectedFault(f"copy failed after {k} pages", point="copy", pages=k)
        event = self.pool.storage.copy_in(pages, payload, deferred=spec is not None)
        self.event = HeldEvent(event, spec.delay_s) if spec is not None else event
        self.new.note_use(self.event)
        self.phase = "copied"

    # ---- step 3 ------------------------------------------------------------------------
    def validate(self) -> None:
        """Wait for the copy event, then check layout, content and zero tails."""
        self._expect("copied")
        if self.new is not None and self.packed is not None:
            assert self.event is not None  # set by start_copy when new is set
            self.event.synchronize()
            self.pool.faults.hit(FaultPoint.VALIDATE, key=self.new.key)
            staged = getattr(self.event, "staged", None)
            self.pool.storage.check_staged(self.new.pages, self.packed, staged,
                                           host_verified=not self.pool.rehash_on_load)
            drop_staging(self.event)
            self.new.transition(S.VALIDATED)
        self.phase = "validated"

    def publish(self) -> Admission:
        """The visibility point, then the commit of pins, KV pages and victims."""
        self._expect("validated", "copied")
        pool, req = self.pool, self.request
        res = self.target
        if self.new is not None and self.packed is not None:
            assert self.event is not None
            if not self.event.query():
                raise PublishBeforeCopy(f"{self.new.key}: copy event not complete")
            if self.phase != "validated":
                raise IllegalTransition("publish before validation", key=self.new.key)
            pool.faults.hit(FaultPoint.PUBLISH, key=self.new.key)
            res = self.new
            publish_residency(pool, self.txn, res, self.packed, self.event)
        assert res is not None
        self.phase = "published"
        # ---- after publication: no rollback, only forward ----
        if self.target is not None:
            pool.release_queue_hold(self.target)
        if req.request_id is not None:
            pool.acquire(res)
            pool.pages.assign(self.txn, self.kv_pages, KvOwner(req.request_id))
        else:
            pool.touch(res)
            res.settle_refcount()
        pool.pages.release_reservation(self.txn)
        victims = tuple((v.key, v.generation) for v in self.victims)
        for v in self.victims:
            v.txn = None
            pool.bury(v)
        pool.audit(self._touched())
        self.phase = "committed"
        pool.stats.loads_committed += 1
        pool.stats.evictions += len(self.victims)
        if self.new is not None and self.packed is not None:
            pool.stats.h2d_bytes += self.packed.nbytes
        assert res.slot is not None
        return Admission(self.txn, res.key, res.generation,
                         pool.slots.table.entries[res.slot].handle, res.pages,
                         self.kv_pages if req.request_id is not None else (), victims,
                         self.new is not None)

    def run(self) -> Admission:
        """All steps; any failure before publication rolls back, then re-raises."""
        self.begin()
        try:
            self.start_copy()
            self.validate()
            return self.publish()
        except BaseException:
            if self.phase not in ("published", "committed"):
                self.abort()
            raise

    # ---- rollback ----------------------------------------------------------------------
    def abort(self) -> None:
        """Compensating rollback of everything since :meth:`begin` (pre-publication only)."""
        if self.phase in ("published", "committed"):
            raise IllegalTransition("cannot roll back after publication; publish a new "
                                    "generation instead")
        if self.phase in ("new", "aborted"):
            return
        pool = self.pool
        if self.target is not None:
            pool.release_queue_hold(self.target)
        if self.new is not None:
            for ev in self.new.events:
                ev.synchronize()  # never reuse pages under an in-flight copy
            self.new.events.clear()
            if self.new.slot is not None:
                pool.slots.discard(self.new.slot)
            self.new.transition(S.ABSENT)
            del pool.residents[(self.new.key, self.new.generation)]
            pool.tombstones.append((self.new.key, self.new.generation))
        failures = []
        for v in self.victims:
            try:
                self.restored.append(restore_victim(pool, self.txn, v))
            except PoolError as exc:
                failures.append(f"{v.key}@g{v.generation}: {exc.message}")
            v.txn = None
            pool.bury(v)
        pool.pages.release_reservation(self.txn)
        self.phase = "aborted"
        pool.stats.loads_rolled_back += 1
        pool.stats.victims_restored += len(self.restored)
        pool.stats.restore_failures += len(failures)
        pool.audit(self._touched())
        if failures:
            raise RestoreFailed("; ".join(failures))

    def _touched(self) -> list[Residency]:
        """Residencies this transaction changed (the audit's scope outside full mode)."""
        touched = [r for r in (self.target, self.new) if r is not None]
        return touched + self.victims

    def _expect(self, *phases: str) -> None:
        if self.phase not in phases:
            raise IllegalTransition(f"transaction {self.txn or '?'} is {self.phase}, "
                                    f"expected {' or '.join(phases)}")


def admit(pool: DevicePool, request: LoadRequest) -> Admission:
    """Run one whole transaction (see :class:`LoadTransaction`)."""
    return LoadTransaction(pool, request).run()

