"""Alias leases and hotswap: resolve once at admission, keep the lease to the end.

Seed §0x07F–0x07I. The worker-local :class:`AliasCatalog` maps ``namespace/alias`` at
catalog generation ``g`` to one immutable :class:`SlotHandle`. A request binds once
(:meth:`LeaseManager.bind`), taking a reference on that exact adapter generation, and
every launch is built from the lease — never by re-resolving the alias — so a republish
cannot move a running request onto other factors. A launch validates the lease's
handle against the current pointer table; a stale slot or pointer generation is
refused (:class:`StaleGeneration`).

Hotswap (:meth:`LeaseManager.publish`) stages the replacement in a free (shadow) slot
through a normal load transaction, then does one compare-and-publish of the catalog;
the previous generation turns ``retiring`` and is reclaimed only when its refcount is 0
and its last-use event has completed. A failure before the catalog update leaves the
catalog untouched and the shadow slot free with bumped generations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dataplane.identity import SlotBinding
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import AliasRetired, CatalogConflict, LeaseError, UnknownAlias
from dataplane.pool.events import CopyEvent
from dataplane.pool.residency import VISIBLE, Residency
from dataplane.pool.slot_table import LaunchSnapshot, SlotHandle
from dataplane.pool.transactions import Admission, LoadRequest, LoadTransaction


@dataclass(frozen=True)
class CatalogEntry:
    """``alias`` at catalog ``generation`` names artifact ``key``; ``handle`` is where it
    was published on this worker (a later cold reload binds a newer handle)."""

    alias: str
    generation: int
    handle: SlotHandle
    residency_generation: int

    @property
    def key(self) -> str:
        return self.handle.artifact_digest


class AliasCatalog:
    """Worker-local alias -> handle map with per-alias catalog generations (CAS updates)."""

    def __init__(self, generations: Mapping[str, int] | None = None) -> None:
        self._gen: dict[str, int] = dict(generations or {})
        self._entries: dict[str, CatalogEntry] = {}
        self._retired: set[str] = set()

    def resolve(self, alias: str) -> CatalogEntry:
        entry = self._entries.get(alias)
        if entry is None and alias in self._retired:
            raise AliasRetired(f"alias {alias!r} was retired at generation "
                               f"{self._gen[alias]}")
        if entry is None:
            raise UnknownAlias(f"alias {alias!r} is not published on this worker")
        return entry

    def generation(self, alias: str) -> int:
        return self._gen.get(alias, 0)

    def compare_and_publish(self, alias: str, expected: int, handle: SlotHandle,
                            residency_generation: int) -> CatalogEntry:
        current = self.generation(alias)
        if current != expected:
            raise CatalogConflict(f"{alias}: expected generation {expected}, have {current}")
        entry = CatalogEntry(alias, current + 1, handle, residency_generation)
        self._gen[alias] = entry.generation
        self._entries[alias] = entry
        self._retired.discard(alias)
        return entry

    def entries(self) -> tuple[CatalogEntry, ...]:
        return tuple(self._entries.values())

    def remove(self, alias: str) -> CatalogEntry:
        entry = self.resolve(alias)
        del self._entries[alias]
        self._gen[alias] = entry.generation + 1
        self._retired.add(alias)
        return entry


@dataclass(frozen=True)
class Lease:
    """A request's binding for its whole lifetime."""

    request_id: str
    alias: str
    catalog_generation: int
    handle: SlotHandle
    residency_generation: int
    kv_pages: tuple[int, ...] = ()


class LeaseManager:
    """Binds requests to alias generations on one :class:`DevicePool`."""

    def __init__(self, pool: DevicePool, catalog: AliasCatalog | None = None) -> None:
        self.pool = pool
        self.catalog = catalog or AliasCatalog()
        self._leases: dict[str, Lease] = {}

    def residency(self, lease: Lease) -> Residency:
        key = (lease.handle.artifact_digest, lease.residency_generation)
        res = self.pool.residents.get(key)
        if res is None:
            raise LeaseError(f"{key} is no longer resident")
        return res

    def publish(self, alias: str, key: str, expected_generation: int | None = None,
                slot: int | None = None, fresh: bool = False) -> CatalogEntry:
        """Stage ``key`` in a shadow slot, then CAS the catalog; the old generation retires.

        ``expected_generation`` defaults to the current one (no concurrent publisher).
        ``fresh`` loads a new residency generation even if ``key`` is resident (recovery
        after a post-publication failure). The previous target retires unless another
        alias still names it. If the CAS loses a race, the staged copy stays resident as
        an ordinary idle (evictable) adapter and :class:`CatalogConflict` is raised.
        """
        expected = self.catalog.generation(alias) if expected_generation is None else (
            expected_generation)
        if self.catalog.generation(alias) != expected:
            raise CatalogConflict(f"{alias}: expected generation {expected}, "
                                  f"have {self.catalog.generation(alias)}")
        request = LoadRequest(key, slot=slot, fresh=fresh)
        admission: Admission = LoadTransaction(self.pool, request).run()
        try:
            old: CatalogEntry | None = self.catalog.resolve(alias)
        except UnknownAlias:
            old = None
        entry = self.catalog.compare_and_publish(alias, expected, admission.handle,
                                                 admission.generation)
        if old is not None:
            self._retire_previous(old.key, keep=(key, admission.generation))
        return entry

    def _retire_previous(self, key: str, keep: tuple[str, int]) -> None:
        named = {e.key for e in self.catalog.entries()}
        for res in list(self.pool.residents.values()):
            if res.key != key or (res.key, res.generation) == keep:
                continue
            if res.key in named and res.key != keep[0]:
                continue  # another alias still serves this artifact
            if res.state in VISIBLE:
                self.pool.retire(res)

    def retire_alias(self, alias: str) -> CatalogEntry:
        """Remove ``alias`` (new binds get :class:`AliasRetired`); its artifact retires
        unless another alias serves it. Running leases finish on their generation."""
        entry = self.catalog.remove(alias)
        self._retire_previous(entry.key, keep=("", 0))
        return entry

    def bind(self, request_id: str, alias: str, kv_initial: int = 0, kv_growth: int = 0,
             guard: int = 0, attempt_id: str | None = None) -> Lease:
        """Resolve ``alias`` once, make its artifact resident if cold (one admission
        transaction, jointly with the request's KV pages) and take a reference on
        that exact generation. Raises a typed error with nothing held on refusal."""
        if request_id in self._leases:
            raise LeaseError(f"request {request_id!r} already holds a lease")
        entry = self.catalog.resolve(alias)
        request = LoadRequest(entry.key, request_id, kv_initial, kv_growth, guard,
                              attempt_id=attempt_id)
        admission = LoadTransaction(self.pool, request).run()
        lease = Lease(request_id, alias, entry.generation, admission.handle,
                      admission.generation, admission.kv_pages)
        self._leases[request_id] = lease
        return lease

    def lease(self, request_id: str) -> Lease:
        try:
            return self._leases[request_id]
        except KeyError:
            raise LeaseError(f"request {request_id!r} holds no lease") from None

    def release(self, request_id: str, last_use: CopyEvent | None = None) -> None:
        """End of request: drop the reference, fenced by its last-use event."""
        lease = self._leases.pop(request_id, None)
        if lease is None:
            raise LeaseError(f"request {request_id!r} holds no lease")
        self.pool.release_ref(self.residency(lease), last_use)

    def begin_launch(self, leases: Iterable[Lease]) -> LaunchSnapshot:
        """Launch snapshot from the leases' own handles (stale -> refused)."""
        return self.pool.begin_launch(lease.handle for lease in leases)

    def end_launch(self, snap: LaunchSnapshot, last_use: CopyEvent) -> None:
        self.pool.end_launch(snap, last_use)
        for entry in snap.entries:
            res = self.pool.residents.get((entry.key, entry.residency_generation))
            if res is not None:
                res.note_use(last_use)


def slot_binding(handle: SlotHandle, *, worker_epoch: int, device_id: str,
                 adapter_semantic: str, kernel_local: str) -> SlotBinding:
    """The identity record (DESIGN.md §3) of a published slot handle on this worker."""
    return SlotBinding(worker_epoch=worker_epoch, device_id=device_id,
                       slot_index=handle.slot_id, slot_generation=handle.slot_generation,
                       pointer_table_generation=handle.pointer_generation,
                       adapter_semantic=adapter_semantic, kernel_local=kernel_local)
