"""Steps shared by load transactions and their compensating rollback.

``verified_host_source`` is the "bytes digest-checked before the copy" gate;
``publish_residency`` is the single visibility point (pointer-table swap, then page
ownership moves from the reservation to the adapter generation); ``restore_victim``
reloads an overwritten victim from its verified host copy into its own pages under a
fresh generation (b@g4 -> b@g5).
"""

from __future__ import annotations

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import HostTierError, PoolError, RestoreFailed, ValidationFailed
from dataplane.pool.events import CopyEvent
from dataplane.pool.packing import PackedAdapter, payload_digest
from dataplane.pool.page_pool import AdapterOwner
from dataplane.pool.residency import Residency, ResidencyState

S = ResidencyState


def verified_host_source(pool: DevicePool, key: str) -> PackedAdapter:
    """The host-tier image of ``key``, its bytes re-hashed unless ``rehash_on_load`` is off."""
    packed = pool.host.get(key)
    if packed is None:
        raise HostTierError(f"{key} is not in the host tier", reason="host_miss")
    if (packed.plan.geometry != pool.geometry
            or packed.payload.dtype != pool.storage.data.dtype):
        raise ValidationFailed(f"{key}: image is {packed.payload.dtype} {packed.plan.geometry}, "
                               f"the pool {pool.storage.data.dtype} {pool.geometry}",
                               reason="layout")
    if pool.rehash_on_load and payload_digest(packed.payload) != packed.bytes_digest:
        raise ValidationFailed(f"{key}: host bytes digest mismatch", reason="digest")
    return packed


def publish_residency(pool: DevicePool, txn: str, res: Residency, packed: PackedAdapter,
                      event: CopyEvent) -> None:
    """VALIDATED -> PUBLISHED: one pointer-table swap (refused before ``event``)."""
    if res.slot is None:
        raise RestoreFailed(f"{res.key}@g{res.generation} has no staged slot")
    pool.slots.publish(res.slot, res.key, res.generation, res.pages, packed.plan, event,
                       prepare=pool.notify_publish)
    pool.pages.assign(txn, res.pages, AdapterOwner(res.key, res.generation))
    res.txn = None
    res.transition(S.PUBLISHED)


def restore_victim(pool: DevicePool, txn: str, victim: Residency) -> tuple[str, int]:
    """Reload ``victim`` (pages still reserved by ``txn``) under a new generation."""
    packed = verified_host_source(pool, victim.key)
    if packed.num_pages != len(victim.pages):
        raise RestoreFailed(f"{victim.key}: host image does not match its pages")
    res = Residency(victim.key, pool.next_generation(victim.key), txn=txn,
                    host_source_verified=True, pages=victim.pages)
    res.transition(S.HOST_READY)
    res.transition(S.RESERVED)
    slot = res.slot = pool.slots.reserve()
    pool.residents[(res.key, res.generation)] = res
    try:
        res.transition(S.LOADING)
        event = pool.storage.copy_in(res.pages, packed.payload)
        event.synchronize()
        pool.storage.check_staged(res.pages, packed)
        res.transition(S.VALIDATED)
        publish_residency(pool, txn, res, packed, event)
    except PoolError:
        pool.slots.discard(slot)
        res.transition(S.ABSENT)
        del pool.residents[(res.key, res.generation)]
        raise
    res.last_touch = victim.last_touch
    res.settle_refcount()
    return (res.key, res.generation)
