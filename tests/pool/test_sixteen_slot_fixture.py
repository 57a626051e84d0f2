"""The sixteen-page admission example, exactly, and its copy-failure rollback.

A pool of 16 pages: 0..3 KV of one request, 4..7 adapter a (active, pinned), 8..11
adapter b (idle), 12..15 free. Admitting adapter c (4 pages, plus 2 + 2 KV pages) evicts
b; a copy failure after b's pages are overwritten restores b as b@g5.
"""

from __future__ import annotations

import pytest
import torch

from dataplane.pool.errors import InjectedFault, ValidationFailed
from dataplane.pool.eviction import ineligibility
from dataplane.pool.faults import FaultAction, FaultInjector, FaultPoint, FaultSpec
from dataplane.pool.packing import factor_shapes
from dataplane.pool.page_demand import AdmissionDemand, adapter_page_demand
from dataplane.pool.page_pool import AdapterOwner, KvOwner, PageClass, ReservedBy
from dataplane.pool.residency import ResidencyState
from dataplane.pool.transactions import LoadRequest, LoadTransaction

from .builders import SLORA_GEOMETRY, sixteen_slot_fixture, square_factors

R1 = LoadRequest("c", request_id="r1#1", kv_initial=2, kv_growth=2, attempt_id="tx7")


def test_geometry_and_demand_match_the_fixture() -> None:
    assert SLORA_GEOMETRY.page_bytes == 64
    assert 16 * SLORA_GEOMETRY.page_bytes == 1024
    fx = sixteen_slot_fixture()
    c = fx.images["c"]
    # demand derived from every module, both factors, every layer: 4 * rank = 4 pages
    assert c.num_pages == 4 and c.nbytes == 256
    demand = AdmissionDemand(c.num_pages, kv_initial=2, kv_growth=2)
    assert (demand.total, demand.total * SLORA_GEOMETRY.page_bytes) == (8, 512)
    pool = fx.pool
    assert pool.pages.num_free == 4
    assert pool.reclaimable_pages(exclude_key="c") == 4  # adapter b only
    live = pool.live_generations()
    a = fx.res("a")
    assert (a.refcount, a.pin_count) == (1, 1)
    assert ineligibility(a, live) == "state active"  # bound by a request (and pinned)
    assert ineligibility(fx.res("b"), live) is None


def test_demand_counts_tensors_not_rank() -> None:
    fx = sixteen_slot_fixture()
    shapes = factor_shapes(square_factors(0, 8, 2, rank=1))
    assert len(shapes) == 8  # 4 modules x 2 layers
    assert adapter_page_demand(shapes, SLORA_GEOMETRY) == 4
    # rank 2 doubles it; one layer halves it: derived from shapes, not rank alone
    assert adapter_page_demand(factor_shapes(square_factors(0, 8, 2, rank=2)),
                               SLORA_GEOMETRY) == 8
    assert adapter_page_demand(factor_shapes(square_factors(0, 8, 1, rank=1)),
                               SLORA_GEOMETRY) == 2
    assert fx.pool.check().total == 16


def test_successful_admission_trace() -> None:
    fx = sixteen_slot_fixture()
    pool = fx.pool
    table_before = pool.slots.table
    txn = LoadTransaction(pool, R1)
    txn.begin()
    # steps 3-4: b proven eligible, retiring and unpublished; slots 8..15 reserved for tx7
    assert txn.reserved == tuple(range(8, 16))
    assert pool.pages.pages_of(ReservedBy("tx7")) == tuple(range(8, 16))
    b4 = pool.residents[("b", 4)]
    assert b4.state is ResidencyState.RETIRING
    assert all(e.key != "b" for e in pool.slots.table.entries.values())
    assert txn.new is not None and txn.new.state is ResidencyState.RESERVED
    # step 5: copy, wait, validate -- still invisible
    txn.start_copy()
    txn.validate()
    assert txn.new.state is ResidencyState.VALIDATED
    assert all(e.key != "c" for e in pool.slots.table.entries.values())
    assert pool.visible("c") is None
    # steps 6-9
    adm = txn.publish()
    assert (adm.key, adm.generation, adm.adapter_pages) == ("c", 1, (8, 9, 10, 11))
    assert adm.kv_pages == (12, 13, 14, 15)
    assert adm.victims == (("b", 4),)
    assert pool.slots.table.generation > table_before.generation
    c = fx.res("c")
    assert c.refcount == 1 and c.state is ResidencyState.ACTIVE
    assert ("b", 4) in pool.tombstones and pool.visible("b") is None
    assert fx.ownership() == {
        KvOwner("r0"): (0, 1, 2, 3),
        AdapterOwner("a", 1): (4, 5, 6, 7),
        AdapterOwner("c", 1): (8, 9, 10, 11),
        KvOwner("r1#1"): (12, 13, 14, 15),
    }
    counts = pool.check()
    assert (counts.free, counts.reserved, counts.adapter, counts.kv) == (0, 0, 8, 8)
    assert torch.equal(pool.storage.read((8, 9, 10, 11)), fx.images["c"].payload)


def test_copy_failure_after_victim_overwrite_restores_b_at_g5() -> None:
    faults = FaultInjector()
    fx = sixteen_slot_fixture(faults)
    pool = fx.pool
    a_before = fx.res("a")
    a_state = (a_before.pages, a_before.generation, a_before.refcount, a_before.pin_count)
    faults.arm(FaultPoint.COPY, FaultSpec(FaultAction.FAIL, after_pages=4))
    txn = LoadTransaction(pool, R1)
    txn.begin()
    with pytest.raises(InjectedFault):
        txn.start_copy()
    # before rollback: b retired and unpublished, its bytes overwritten, 8..15 held by tx7
    assert pool.residents[("b", 4)].state is ResidencyState.RETIRING
    assert pool.pages.pages_of(ReservedBy("tx7")) == tuple(range(8, 16))
    assert torch.equal(pool.storage.read((8, 9, 10, 11)), fx.images["c"].payload)
    assert not torch.equal(fx.images["c"].payload, fx.images["b"].payload)
    assert pool.visible("c") is None and not pool.pages.pages_of(KvOwner("r1#1"))
    txn.abort()
    # after rollback
    a = fx.res("a")
    assert (a.pages, a.generation, a.refcount, a.pin_count) == a_state
    assert pool.pages.pages_of(KvOwner("r0")) == (0, 1, 2, 3)
    b = fx.res("b")
    assert (b.generation, b.pages, b.state) == (5, (8, 9, 10, 11), ResidencyState.IDLE)
    assert torch.equal(pool.storage.read(b.pages), fx.images["b"].payload)
    assert any(e.key == "b" and e.residency_generation == 5
               for e in pool.slots.table.entries.values())
    assert pool.visible("c") is None and not any(k == "c" for k, _ in pool.residents)
    assert not pool.pages.pages_of(KvOwner("r1#1"))
    assert pool.pages.free_pages() == (12, 13, 14, 15)
    assert all(pool.pages.class_of(p) is PageClass.FREE for p in range(12, 16))
    counts = pool.check()
    assert counts.free + counts.reserved + counts.adapter + counts.kv == 16
    assert counts.reserved == 0


def test_post_copy_validation_failure_rolls_back_the_same_way() -> None:
    faults = FaultInjector()
    fx = sixteen_slot_fixture(faults)
    faults.arm(FaultPoint.VALIDATE, FaultSpec(FaultAction.FAIL))
    with pytest.raises(InjectedFault):
        LoadTransaction(fx.pool, R1).run()
    assert fx.res("b").generation == 5
    assert torch.equal(fx.pool.storage.read((8, 9, 10, 11)), fx.images["b"].payload)
    assert fx.pool.pages.free_pages() == (12, 13, 14, 15)
    fx.pool.check()


def test_host_digest_mismatch_is_refused_before_anything_changes() -> None:
    fx = sixteen_slot_fixture()
    pool = fx.pool
    fx.images["c"].payload[0, 0] += 1  # host copy rots after it was admitted to the tier
    before = (fx.ownership(), pool.slots.table, dict(pool.residents))
    with pytest.raises(ValidationFailed) as err:
        LoadTransaction(pool, R1).run()
    assert err.value.detail["reason"] == "digest"
    assert (fx.ownership(), pool.slots.table, dict(pool.residents)) == before
    assert fx.res("b").generation == 4
