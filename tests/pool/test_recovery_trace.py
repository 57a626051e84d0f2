"""Recovery of a cold load, tick by tick: a failed attempt closes everything it owned
before the next one starts, and the next one is a new transaction.

A cold adapter D (verified in the host tier, nothing on the device), a pool of eight free
pages and a load of three pages, for request d0 (queued at tick 0; the agent keeps that
arrival across attempts, tests/agent/test_load_retry.py):

    tick  event                                              free pages
    0     load-d-1 reserves 3 pages, stages a slot           5
    1     load-d-1's copy fails: nothing served or published 5
    1     load-d-1 rolled back                               8
    3     load-d-2 (a new id) reserves 3 pages               5
    3     load-d-2 validates and publishes D@g2              5
    4     d0 runs on D@g2 and completes                      5
    5     d0 released; D, held by nobody, reclaimed          8

The load's three pages are what the page geometry makes of D's tensors (derived below,
not read back from the pool).
"""

from __future__ import annotations

import math

import pytest
import torch

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import IllegalTransition, InjectedFault, StaleGeneration
from dataplane.pool.events import CompletedEvent
from dataplane.pool.faults import FaultAction, FaultInjector, FaultPoint, FaultSpec
from dataplane.pool.host_tier import HostTier
from dataplane.pool.page_pool import AdapterOwner
from dataplane.pool.residency import ResidencyState
from dataplane.pool.slot_table import SlotHandle
from dataplane.pool.transactions import LoadRequest, LoadTransaction

from .builders import SLORA_GEOMETRY, H, L, packed

FREE_PAGES = 8
LOAD_PAGES = 3
D_MODULES = ("q_proj", "k_proj", "v_proj")
D_RANK = 1
REQUEST = "d0"

TRACE = [
    (0, "reserve load-d-1", 5),
    (1, "fail load-d-1", 5),
    (1, "roll back load-d-1", 8),
    (3, "reserve load-d-2", 5),
    (3, "publish d@g2", 5),
    (4, "complete d0", 5),
    (5, "release d0", 8),
]


def d_pages_from_geometry() -> int:
    """Every (layer, module) stores D_RANK rows of A (d_in = H) and D_RANK rows of Bt
    (d_out = H); a page holds page_elems // H such rows and a row never straddles one."""
    rows = L * len(D_MODULES) * 2 * D_RANK
    return math.ceil(rows / (SLORA_GEOMETRY.page_elems // H))


def cold_pool(faults: FaultInjector) -> DevicePool:
    host = HostTier(byte_budget=1 << 20, pin_memory=False)
    host.put(packed("d", 4, SLORA_GEOMETRY, rank=D_RANK, modules=D_MODULES))
    return DevicePool(SLORA_GEOMETRY, FREE_PAGES, num_slots=2, dtype=torch.float16,
                      host_tier=host, faults=faults)


def attempt(n: int) -> LoadRequest:
    return LoadRequest("d", request_id=REQUEST, attempt_id=f"load-d-{n}")


def test_the_geometry_makes_d_a_three_page_load() -> None:
    assert d_pages_from_geometry() == LOAD_PAGES
    assert packed("d", 4, SLORA_GEOMETRY, rank=D_RANK, modules=D_MODULES).num_pages == \
        LOAD_PAGES


def test_failed_attempt_rolls_back_then_a_new_attempt_publishes_a_newer_generation() -> None:
    faults = FaultInjector()
    faults.arm(FaultPoint.COPY, FaultSpec(FaultAction.FAIL, after_pages=1))
    pool = cold_pool(faults)
    assert pool.pages.num_free == FREE_PAGES and pool.visible("d") is None
    table_before = pool.slots.table
    trace: list[tuple[int, str, int]] = []

    def note(tick: int, event: str) -> None:
        trace.append((tick, event, pool.pages.num_free))

    # tick 0: the first attempt reserves D's pages and stages a slot
    first = LoadTransaction(pool, attempt(1))
    first.begin()
    note(0, "reserve load-d-1")
    assert first.txn == "load-d-1" and len(first.reserved) == d_pages_from_geometry()
    assert pool.pages.counts().reserved == LOAD_PAGES
    assert first.new is not None and first.new.slot is not None
    staged_generation = first.new.generation
    staged_slot = first.new.slot
    staged_slot_gen, staged_ptr_gen = pool.slots.generations(staged_slot)

    # tick 1: the copy fails after one page; nothing was published or bound
    with pytest.raises(InjectedFault):
        first.start_copy()
    note(1, "fail load-d-1")
    assert pool.visible("d") is None and pool.slots.table is table_before
    assert pool.stats.loads_committed == 0
    first.abort()
    note(1, "roll back load-d-1")
    assert first.phase == "aborted" and pool.stats.loads_rolled_back == 1
    counts = pool.check()
    assert (counts.free, counts.reserved, counts.adapter, counts.kv) == (FREE_PAGES, 0, 0, 0)
    assert pool.residents == {} and ("d", staged_generation) in pool.tombstones
    assert pool.slots.table is table_before  # the state before the attempt still rules
    assert pool.gauges()["slots"]["staging"] == 0
    with pytest.raises(IllegalTransition, match="already used"):
        LoadTransaction(pool, attempt(1)).begin()  # a retry never reuses the id
    assert pool.pages.num_free == FREE_PAGES

    # tick 3: the retry is a new transaction with a new id
    second = LoadTransaction(pool, attempt(2))
    second.begin()
    note(3, "reserve load-d-2")
    assert second.txn == "load-d-2"
    second.start_copy()
    second.validate()
    admission = second.publish()
    note(3, "publish d@g2")
    assert (admission.txn, admission.key, admission.generation) == ("load-d-2", "d", 2)
    assert admission.generation > staged_generation
    assert len(admission.adapter_pages) == LOAD_PAGES and admission.kv_pages == ()
    handle = admission.handle
    assert handle.slot_id == staged_slot  # the same slot index, a newer identity
    assert handle.slot_generation > staged_slot_gen
    assert handle.pointer_generation > staged_ptr_gen
    assert pool.slots.table.generation > table_before.generation
    staged = SlotHandle(staged_slot, staged_slot_gen, staged_ptr_gen + 1, "d")
    with pytest.raises(StaleGeneration):  # nothing the failed attempt staged ever resolves
        pool.begin_launch([staged])
    d = pool.visible("d")
    assert d is not None and (d.state, d.refcount) == (ResidencyState.ACTIVE, 1)
    assert pool.pages.pages_of(AdapterOwner("d", 2)) == admission.adapter_pages

    # tick 4: d0 is selected, runs on D@g2 and completes
    launch = pool.begin_launch([handle])
    assert launch.generations == frozenset({("d", 2)})
    pool.end_launch(launch, CompletedEvent())
    note(4, "complete d0")
    assert pool.stats.loads_committed == 1

    # tick 5: d0 lets go; nothing else holds or names D, so its pages return
    pool.release_ref(d, CompletedEvent())
    assert pool.retire(d) is True
    note(5, "release d0")
    assert pool.visible("d") is None
    counts = pool.check()
    assert (counts.free, counts.reserved, counts.adapter, counts.kv) == (FREE_PAGES, 0, 0, 0)

    assert trace == TRACE
