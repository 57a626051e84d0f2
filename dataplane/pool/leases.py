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

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import CatalogConflict, LeaseError, Retiring, UnknownAlias
from dataplane.pool.events import CopyEvent
from dataplane.pool.residency import Residency, ResidencyState
from dataplane.pool.slot_table import LaunchSnapshot, SlotHandle
from dataplane.pool.transactions import Admission, LoadRequest, LoadTransaction


@dataclass(frozen=True)
class CatalogEntry:
    alias: str
    generation: int
    handle: SlotHandle
    residency_generation: int


class AliasCatalog:
    """Worker-local alias -> handle map with per-alias catalog generations (CAS updates)."""

    def __init__(self, generations: Mapping[str, int] | None = None) -> None:
        self._gen: dict[str, int] = dict(generations or {})
        self._entries: dict[str, CatalogEntry] = {}

    def resolve(self, alias: str) -> CatalogEntry:
        entry = self._entries.get(alias)
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
        return entry

    def remove(self, alias: str) -> CatalogEntry:
        entry = self.resolve(alias)
        del self._entries[alias]
        self._gen[alias] = entry.generation + 1
        return entry


@dataclass(frozen=True)
class Lease:
    """A request's binding for its whole lifetime."""

    request_id: str
    alias: str
    catalog_generation: int
    handle: SlotHandle
    residency_generation: int


class LeaseManager:
    """Binds requests to alias generations on one :class:`DevicePool`."""

    def __init__(self, pool: DevicePool, catalog: AliasCatalog | None = None) -> None:
        self.pool = pool
        self.catalog = catalog or AliasCatalog()
        self._leases: dict[str, Lease] = {}

    def residency(self, lease: Lease | CatalogEntry) -> Residency:
        key = (lease.handle.artifact_digest, lease.residency_generation)
        res = self.pool.residents.get(key)
        if res is None:
            raise LeaseError(f"{key} is no longer resident")
        return res

    def publish(self, alias: str, key: str, expected_generation: int | None = None,
                slot: int | None = None, fresh: bool = False) -> CatalogEntry:
        """Stage ``key`` in a shadow slot, then CAS the catalog; the old generation retires.

        ``expected_generation`` defaults to the current one (no concurrent publisher).
        """
        expected = self.catalog.generation(alias) if expected_generation is None else (
            expected_generation)
        if self.catalog.generation(alias) != expected:
            raise CatalogConflict(f"{alias}: expected generation {expected}, "
                                  f"have {self.catalog.generation(alias)}")
        request = LoadRequest(key, slot=slot, fresh=fresh)
        admission: Admission = LoadTransaction(self.pool, request).run()
        try:
            old = self.catalog.resolve(alias)
        except UnknownAlias:
            old = None
        entry = self.catalog.compare_and_publish(alias, expected, admission.handle,
                                                 admission.generation)
        if old is not None and old.handle != entry.handle:
            old_res = self.residency(old)
            if old_res.state is not ResidencyState.RETIRING:
                self.pool.retire(old_res)
        return entry

    def bind(self, request_id: str, alias: str) -> Lease:
        """Resolve ``alias`` once and take a reference on that generation."""
        if request_id in self._leases:
            raise LeaseError(f"request {request_id!r} already holds a lease")
        entry = self.catalog.resolve(alias)
        res = self.residency(entry)
        if res.state is ResidencyState.RETIRING:
            raise Retiring(f"{alias}@{entry.generation} is retiring")
        self.pool.slots.validate(entry.handle)
        self.pool.acquire(res)
        lease = Lease(request_id, alias, entry.generation, entry.handle,
                      entry.residency_generation)
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
