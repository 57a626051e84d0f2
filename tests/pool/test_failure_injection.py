"""Failure cases of the pool / residency / lease layer (docs/ARCHITECTURE.md, "Failure
behaviour")."""

from __future__ import annotations

import pytest
import torch

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import (
    AdmissionRefused,
    ConservationError,
    IllegalTransition,
    KvCapacityExhausted,
    PublishBeforeCopy,
    RestoreFailed,
    StaleGeneration,
    ValidationFailed,
)
from dataplane.pool.events import PendingEvent
from dataplane.pool.faults import FaultAction, FaultInjector, FaultPoint, FaultSpec
from dataplane.pool.host_tier import HostTier
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.page_pool import AdapterOwner, KvOwner, PageClass
from dataplane.pool.residency import ResidencyState
from dataplane.pool.transactions import LoadRequest, LoadTransaction, admit

from .builders import SixteenSlot, packed, sixteen_slot_fixture

R1 = LoadRequest("c", request_id="r1#1", kv_initial=2, kv_growth=2)


def snapshot(fx: SixteenSlot) -> tuple[object, ...]:
    p = fx.pool
    return (fx.ownership(), p.slots.table, sorted(p.residents),
            [(r.state, r.refcount, r.pin_count, r.queued_reservations)
             for _, r in sorted(p.residents.items())])


def test_cancel_during_transfer_waits_for_the_copy_then_rolls_back() -> None:
    faults = FaultInjector()
    fx = sixteen_slot_fixture(faults)
    faults.arm(FaultPoint.COPY, FaultSpec(FaultAction.DELAY))
    txn = LoadTransaction(fx.pool, R1)
    txn.begin()
    txn.start_copy()
    assert txn.event is not None and not txn.event.query()  # DMA in flight
    assert txn.new is not None and txn.new.state is ResidencyState.LOADING
    txn.abort()  # request cancelled
    assert txn.event.query()  # waited before any page was reused
    assert fx.res("b").generation == 5
    assert torch.equal(fx.pool.storage.read((8, 9, 10, 11)), fx.images["b"].payload)
    assert fx.pool.visible("c") is None
    fx.pool.check()


def test_publish_before_copy_event_is_refused() -> None:
    faults = FaultInjector()
    fx = sixteen_slot_fixture(faults)
    faults.arm(FaultPoint.COPY, FaultSpec(FaultAction.DELAY))
    txn = LoadTransaction(fx.pool, R1)
    txn.begin()
    txn.start_copy()
    with pytest.raises(PublishBeforeCopy):
        txn.publish()
    assert fx.pool.visible("c") is None
    assert all(e.key != "c" for e in fx.pool.slots.table.entries.values())
    # the slot table refuses on its own as well
    slot = txn.new.slot if txn.new else None
    assert slot is not None
    with pytest.raises(PublishBeforeCopy):
        fx.pool.slots.publish(slot, "c", 1, (8, 9, 10, 11), fx.images["c"].plan,
                              PendingEvent())
    txn.abort()
    fx.pool.check()


def test_evict_while_queued_request_holds_reservation_is_refused() -> None:
    fx = sixteen_slot_fixture()
    fx.pool.hold_for_queue(fx.res("b"))
    before = snapshot(fx)
    with pytest.raises(AdmissionRefused):
        admit(fx.pool, R1)
    assert snapshot(fx) == before
    fx.pool.release_queue_hold(fx.res("b"))
    assert admit(fx.pool, R1).victims == (("b", 4),)


def test_evict_generation_named_by_live_launch_is_refused() -> None:
    fx = sixteen_slot_fixture()
    b = fx.res("b")
    handle = fx.pool.slots.table.entries[b.slot or 0].handle
    snap = fx.pool.begin_launch([handle])
    before = snapshot(fx)
    with pytest.raises(AdmissionRefused):
        admit(fx.pool, R1)
    done = PendingEvent()
    fx.pool.end_launch(snap, done)  # host side finished, device work still running
    with pytest.raises(AdmissionRefused):
        admit(fx.pool, R1)
    assert snapshot(fx) == before
    done.synchronize()
    assert admit(fx.pool, R1).victims == (("b", 4),)


def test_victim_without_verified_host_source_is_never_evicted() -> None:
    fx = sixteen_slot_fixture()
    fx.pool.host.discard("b")
    before = snapshot(fx)
    with pytest.raises(AdmissionRefused):
        admit(fx.pool, R1)
    assert snapshot(fx) == before


def test_restore_failure_frees_victim_pages_and_keeps_conservation() -> None:
    faults = FaultInjector()
    fx = sixteen_slot_fixture(faults)
    faults.arm(FaultPoint.COPY, FaultSpec(FaultAction.FAIL, after_pages=2))
    txn = LoadTransaction(fx.pool, R1)
    txn.begin()
    fx.pool.host.discard("b")  # the trusted source vanished mid-transaction
    with pytest.raises(RestoreFailed):
        try:
            txn.start_copy()
        except Exception:
            txn.abort()
            raise
    assert fx.pool.visible("b") is None and fx.pool.visible("c") is None
    assert fx.pool.pages.free_pages() == tuple(range(8, 16))
    fx.pool.check()


def test_padded_tail_garbage_fails_validation_and_rolls_back() -> None:
    geo = PageGeometry(page_elems=12, elem_bytes=2)  # rows of 8: one row per page, tail 4
    host = HostTier(1 << 20, pin_memory=False)
    host.put(packed("x", 1, geo, hidden=8, layers=1, modules=("q_proj",)))
    pool = DevicePool(geo, 8, 2, torch.float16, host_tier=host)
    txn = LoadTransaction(pool, LoadRequest("x"))
    txn.begin()
    txn.start_copy()
    assert txn.new is not None
    pool.storage.data[txn.new.pages[0], 10] = 3.0  # stale byte in a padded tail
    with pytest.raises(ValidationFailed) as err:
        txn.validate()
    assert err.value.detail["reason"] == "padded_tail"
    txn.abort()
    assert pool.pages.num_free == 8 and pool.visible("x") is None
    pool.check()


def test_fill_with_adapters_then_grow_kv() -> None:
    geo = PageGeometry(page_elems=32, elem_bytes=2)
    host = HostTier(1 << 20, pin_memory=False)
    for i, key in enumerate("pqrs"):
        host.put(packed(key, i, geo))
    pool = DevicePool(geo, 16, 4, torch.float16, host_tier=host)
    for key in "pqrs":
        admit(pool, LoadRequest(key))  # 4 idle adapters fill all 16 pages
    admit(pool, LoadRequest("q", request_id="live"))  # q now referenced, p stays LRU
    assert pool.pages.num_free == 0
    pages = pool.allocate_kv("grow", 2)
    assert pages == (0, 1) and pool.visible("p") is None  # LRU idle victim evicted
    assert pool.pages.class_of(2) is PageClass.FREE
    for key in "rs":
        pool.pin(pool.visible(key))  # type: ignore[arg-type]
    before = (pool.pages.counts(), pool.slots.table)
    with pytest.raises(KvCapacityExhausted):
        pool.allocate_kv("grow", 4)  # 2 free + nothing eligible
    assert (pool.pages.counts(), pool.slots.table) == before
    pool.check()


def test_fill_with_kv_then_request_cold_adapter() -> None:
    fx = sixteen_slot_fixture()
    fx.pool.allocate_kv("r2", 4)
    fx.pool.pin(fx.res("b"))
    before = snapshot(fx)
    with pytest.raises(AdmissionRefused) as err:
        admit(fx.pool, R1)
    assert err.value.code == "INSUFFICIENT_ELIGIBLE_PAGES"
    assert snapshot(fx) == before
    fx.pool.check()


def test_stale_generation_at_launch_is_refused_after_slot_reuse() -> None:
    fx = sixteen_slot_fixture()
    b_slot = fx.res("b").slot
    assert b_slot is not None
    old = fx.pool.slots.table.entries[b_slot].handle
    admit(fx.pool, R1)  # evicts b; c may reuse the very same slot index
    with pytest.raises(StaleGeneration):
        fx.pool.begin_launch([old])
    c_handle = fx.pool.slots.table.entries[fx.res("c").slot or 0].handle
    assert c_handle.slot_id == old.slot_id and c_handle.slot_generation > old.slot_generation


def test_load_attempt_id_is_never_reused() -> None:
    faults = FaultInjector()
    fx = sixteen_slot_fixture(faults)
    faults.arm(FaultPoint.VALIDATE, FaultSpec(FaultAction.FAIL))
    req = LoadRequest("c", request_id="r1#1", kv_initial=2, kv_growth=2, attempt_id="load-1")
    with pytest.raises(Exception, match="INJECTED_FAULT"):
        admit(fx.pool, req)
    with pytest.raises(IllegalTransition, match="already used"):
        admit(fx.pool, req)
    adm = admit(fx.pool, LoadRequest("c", request_id="r1#1", kv_initial=2, kv_growth=2,
                                     attempt_id="load-2"))
    assert adm.txn == "load-2" and adm.victims == (("b", 5),)


def test_rollback_after_publication_is_refused() -> None:
    fx = sixteen_slot_fixture()
    txn = LoadTransaction(fx.pool, R1)
    txn.run()
    with pytest.raises(IllegalTransition, match="new generation"):
        txn.abort()


def test_leftover_owner_after_bitmap_release_is_detected() -> None:
    fx = sixteen_slot_fixture()
    fx.pool.pages.release(AdapterOwner("b", 4))  # bitmap freed, residency still attached
    with pytest.raises(ConservationError):
        fx.pool.check()


def test_kv_pages_are_not_adapter_pages() -> None:
    fx = sixteen_slot_fixture()
    with pytest.raises(Exception, match="PAGE_OWNERSHIP"):
        fx.pool.pages.release(KvOwner("r0"), [4])
    assert fx.pool.check().kv == 4


def test_guard_pages_are_part_of_the_inequality() -> None:
    fx = sixteen_slot_fixture()
    before = snapshot(fx)
    with pytest.raises(AdmissionRefused):
        admit(fx.pool, LoadRequest("c", request_id="r1#1", kv_initial=2, kv_growth=2, guard=1))
    assert snapshot(fx) == before


def test_no_free_slot_and_no_eligible_slot_holder_changes_nothing() -> None:
    geo = PageGeometry(page_elems=32, elem_bytes=2)
    host = HostTier(1 << 20, pin_memory=False)
    for i, key in enumerate("pqr"):
        host.put(packed(key, i, geo))
    pool = DevicePool(geo, 32, 2, torch.float16, host_tier=host)
    admit(pool, LoadRequest("p", request_id="x"))
    admit(pool, LoadRequest("q"))
    admit(pool, LoadRequest("r"))  # pages are plentiful; q's slot is reclaimed for r
    assert pool.visible("q") is None and pool.stats.evictions == 1
    before = (pool.pages.counts(), pool.slots.table, sorted(pool.residents))
    pool.pin(pool.visible("r"))  # type: ignore[arg-type]
    with pytest.raises(AdmissionRefused, match="slot"):
        admit(pool, LoadRequest("q"))
    assert (pool.pages.counts(), pool.slots.table, sorted(pool.residents)) == before
    assert pool.gauges()["slots"] == {"free": 0, "staging": 0, "published": 2, "retiring": 0}
    assert pool.gauges()["residency"]["active"] == 1


def test_resident_target_is_held_for_an_open_admission() -> None:
    fx = sixteen_slot_fixture()
    txn = LoadTransaction(fx.pool, LoadRequest("b", request_id="r5", kv_initial=1))
    txn.begin()  # b already resident: only KV is reserved, b is held meanwhile
    assert fx.res("b").queued_reservations == 1
    with pytest.raises(KvCapacityExhausted):
        fx.pool.allocate_kv("r6", 4)  # would need b's pages
    txn.start_copy()
    txn.validate()
    adm = txn.publish()
    assert (adm.loaded, adm.kv_pages, adm.generation) == (False, (12,), 4)
    b = fx.res("b")
    assert (b.queued_reservations, b.refcount, b.state) == (0, 1, ResidencyState.ACTIVE)
    fx.pool.check()


def test_wrong_dtype_image_is_refused_before_the_copy() -> None:
    host = HostTier(1 << 20, pin_memory=False)
    geo = PageGeometry(page_elems=32, elem_bytes=2)
    host.put(packed("bf", 0, geo, dtype=torch.bfloat16))
    pool = DevicePool(geo, 8, 2, torch.float16, host_tier=host)
    with pytest.raises(ValidationFailed) as err:
        admit(pool, LoadRequest("bf"))
    assert err.value.detail["reason"] == "layout"
    assert pool.pages.num_free == 8 and pool.residents == {} and pool.stats.loads_rolled_back == 0
    pool.check()


def test_retiring_adapter_is_reclaimed_when_the_last_fence_clears() -> None:
    fx = sixteen_slot_fixture()
    b = fx.res("b")
    fx.pool.hold_for_queue(b)
    fx.pool.pin(b)
    assert fx.pool.retire(b) is False  # stop new binds; pages stay
    assert fx.pool.pages.pages_of(AdapterOwner("b", 4)) == (8, 9, 10, 11)
    fx.pool.unpin(b)
    assert ("b", 4) in fx.pool.residents
    fx.pool.release_queue_hold(b)  # last fence: reclaimed now
    assert ("b", 4) not in fx.pool.residents and fx.pool.pages.num_free == 8
    fx.pool.check()
