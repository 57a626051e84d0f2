"""Load/admission transactions: reserve -> copy -> validate -> publish, or roll back.

Seed §0x04E, §0x05B, §0x05F. One :class:`LoadTransaction` admits one request (or a
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

The pool audit (:meth:`DevicePool.check`) runs after every commit and every rollback.
A failure after publication is not rolled back: recovery is a new generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import (
    HostTierError,
    IllegalTransition,
    InjectedFault,
    PoolError,
    PublishBeforeCopy,
    RestoreFailed,
    ValidationFailed,
)
from dataplane.pool.events import CopyEvent
from dataplane.pool.eviction import choose_victims, is_eligible
from dataplane.pool.faults import FaultAction, FaultPoint
from dataplane.pool.packing import PackedAdapter, payload_digest
from dataplane.pool.page_demand import AdmissionDemand, check_admission
from dataplane.pool.page_pool import AdapterOwner, KvOwner
from dataplane.pool.residency import VISIBLE, Residency, ResidencyState
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
            self.packed = self._verified_host_source(req.key)
        incremental = 0 if self.target else self.packed.num_pages if self.packed else 0
        demand = AdmissionDemand(incremental, req.kv_initial, req.kv_growth, req.guard)
        free = pool.pages.num_free
        live = pool.live_generations()
        candidates = [r for r in pool.candidates(req.key) if r is not self.target]
        check_admission(free, sum(len(r.pages) for r in candidates if is_eligible(r, live)),
                        demand)
        victims = choose_victims(candidates, demand.total - free, live)
        slot = None
        if self.target is None:
            if req.slot is None and not pool.slots.free_slots():
                spare = [r for r in candidates if r not in victims and is_eligible(r, live)]
                victims += choose_victims(spare, 1, live)[:1] if spare else []
            elif req.slot is not None and req.slot not in pool.slots.free_slots():
                raise IllegalTransition(f"slot {req.slot} is not free", slot=req.slot)
        # ---- mutation starts: nothing above changed any state ----
        self.txn = pool.next_txn_id(req.attempt_id)
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
        pool.check()

    def _verified_host_source(self, key: str) -> PackedAdapter:
        packed = self.pool.host.get(key)
        if packed is None:
            raise HostTierError(f"{key} is not in the host tier", reason="host_miss")
        if self.pool.rehash_on_load and payload_digest(packed.payload) != packed.bytes_digest:
            raise ValidationFailed(f"{key}: host bytes digest mismatch", reason="digest")
        return packed

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
            self.pool.storage.copy_in(pages[:k], payload[:k])
            raise InjectedFault(f"copy failed after {k} pages", point="copy", pages=k)
        deferred = spec is not None and spec.action is FaultAction.DELAY
        self.event = self.pool.storage.copy_in(pages, payload, deferred=deferred)
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
            self.pool.storage.check_staged(self.new.pages, self.packed)
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
            self._publish(res, self.packed, self.event)
        assert res is not None
        self.phase = "published"
        # ---- after publication: no rollback, only forward ----
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
        pool.check()
        self.phase = "committed"
        assert res.slot is not None
        return Admission(self.txn, res.key, res.generation,
                         pool.slots.table.entries[res.slot].handle, res.pages,
                         self.kv_pages if req.request_id is not None else (), victims,
                         self.new is not None)

    def _publish(self, res: Residency, packed: PackedAdapter, event: CopyEvent) -> None:
        pool = self.pool
        assert res.slot is not None
        pool.slots.publish(res.slot, res.key, res.generation, res.pages, packed.plan, event,
                           prepare=pool.notify_publish)
        pool.pages.assign(self.txn, res.pages, AdapterOwner(res.key, res.generation))
        res.txn = None
        res.transition(S.PUBLISHED)

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
                self.restored.append(self._restore(v))
            except PoolError as exc:
                failures.append(f"{v.key}@g{v.generation}: {exc.message}")
            v.txn = None
            pool.bury(v)
        pool.pages.release_reservation(self.txn)
        self.phase = "aborted"
        pool.check()
        if failures:
            raise RestoreFailed("; ".join(failures))

    def _restore(self, victim: Residency) -> tuple[str, int]:
        """Reload ``victim`` from its verified host copy into its own pages, new generation."""
        pool = self.pool
        packed = self._verified_host_source(victim.key)
        if packed.num_pages != len(victim.pages):
            raise RestoreFailed(f"{victim.key}: host image does not match its pages")
        res = Residency(victim.key, pool.next_generation(victim.key), txn=self.txn,
                        host_source_verified=True, pages=victim.pages)
        res.transition(S.HOST_READY)
        res.transition(S.RESERVED)
        res.slot = pool.slots.reserve()
        pool.residents[(res.key, res.generation)] = res
        try:
            res.transition(S.LOADING)
            event = pool.storage.copy_in(res.pages, packed.payload)
            event.synchronize()
            pool.storage.check_staged(res.pages, packed)
            res.transition(S.VALIDATED)
            self._publish(res, packed, event)
        except PoolError:
            pool.slots.discard(res.slot)
            res.transition(S.ABSENT)
            del pool.residents[(res.key, res.generation)]
            raise
        res.last_touch = victim.last_touch
        res.settle_refcount()
        return (res.key, res.generation)

    def _expect(self, *phases: str) -> None:
        if self.phase not in phases:
            raise IllegalTransition(f"transaction {self.txn or '?'} is {self.phase}, "
                                    f"expected {' or '.join(phases)}")


def admit(pool: DevicePool, request: LoadRequest) -> Admission:
    """Run one whole transaction (see :class:`LoadTransaction`)."""
    return LoadTransaction(pool, request).run()


def is_ready(pool: DevicePool, key: str) -> bool:
    res = pool.visible(key)
    return res is not None and res.state in VISIBLE
