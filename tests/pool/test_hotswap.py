"""Seed §0x07F–0x07I: hotswap trace with request leases, exact outputs, ABA defense.

The reference outputs are exact fractions from the seed (y_o = [4, 19/2], y_n = [5, 3]);
the computed ones go through the pool's pages, the kernel address tables and the
kernels' torch backend, reading factors only through each request's own lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import pytest
import torch

from dataplane.kernels.base import LoraMetaBuffers
from dataplane.kernels.torch_backend import TorchLoraBackend
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import InjectedFault, NotResident, StaleGeneration
from dataplane.pool.events import PendingEvent
from dataplane.pool.faults import FaultAction, FaultInjector, FaultPoint, FaultSpec
from dataplane.pool.host_tier import HostTier
from dataplane.pool.kernel_tables import KernelTables, ModuleGroup
from dataplane.pool.leases import AliasCatalog, Lease, LeaseManager
from dataplane.pool.packing import pack_adapter
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.residency import ResidencyState
from dataplane.pool.slot_table import SlotHandle, SlotState

W = [[2, -1, 0], [1, 3, -2]]
X_OLD, X_NEW = [1, 2, -1], [2, 0, 1]
Y_OLD = [Fraction(4), Fraction(19, 2)]
Y_NEW = [Fraction(5), Fraction(3)]
NUM_SLOTS = 16


def reference(delta: list[list[Fraction]], x: list[int]) -> list[Fraction]:
    """Exact y = (W + delta) x over fractions (the seed's merged operator)."""
    return [sum((Fraction(W[i][j]) + delta[i][j]) * x[j] for j in range(3)) for i in range(2)]


F = Fraction
DELTA_OLD = [[F(1, 2), F(2), F(1, 2)], [F(-1, 2), F(1), F(1)]]
DELTA_NEW = [[F(1, 2), F(-1, 4), F(0)], [F(3, 2), F(-3, 4), F(0)]]


@dataclass
class Swap:
    pool: DevicePool
    leases: LeaseManager
    tables: KernelTables
    faults: FaultInjector


def build() -> Swap:
    # old: rank 2, s = 1/2, s * B A = DELTA_OLD; new: logical rank 1 in a physical rank-2 slot
    a_old = torch.tensor([[1.0, 4.0, 1.0], [-1.0, 2.0, 2.0]])
    b_old = torch.eye(2)
    a_new = torch.tensor([[2.0, -1.0, 0.0]])
    b_new = torch.tensor([[1.0], [3.0]])
    geo = PageGeometry(page_elems=4, elem_bytes=4)
    host = HostTier(1 << 16, pin_memory=False)
    host.put(pack_adapter("old", {(0, "proj"): (a_old, b_old, Fraction(1, 2))}, geo,
                          torch.float32, physical_rank=2))
    host.put(pack_adapter("new", {(0, "proj"): (a_new, b_new, Fraction(1, 4))}, geo,
                          torch.float32, physical_rank=2))
    faults = FaultInjector()
    pool = DevicePool(geo, 32, NUM_SLOTS, torch.float32, host_tier=host, faults=faults,
                      slot_generations={7: (11, 30), 8: (20, 40)})
    tables = KernelTables(pool.storage, [ModuleGroup(0, "proj", ("proj",), 3, (2,))],
                          NUM_SLOTS, max_rank=2)
    pool.listeners.append(tables)
    leases = LeaseManager(pool, AliasCatalog({"tenant-a": 7}))
    leases.publish("tenant-a", "old", slot=7)
    return Swap(pool, leases, tables, faults)


def run_request(sw: Swap, lease: Lease, x: list[int]) -> list[float]:
    """One launch for one request row, built from its lease (never from the alias)."""
    snap = sw.leases.begin_launch([lease])
    weights = sw.tables.weights(0, "proj")
    xt = torch.tensor([x], dtype=torch.float32)
    y = xt @ torch.tensor(W, dtype=torch.float32).T
    backend = TorchLoraBackend()
    meta = backend.build_meta(torch.tensor([lease.handle.slot_id]),
                              LoraMetaBuffers(1, NUM_SLOTS, "cpu"))
    backend.add_lora(y, xt, meta, weights)
    sw.leases.end_launch(snap, PendingEvent())  # completes when waited on
    return y[0].tolist()


def test_reference_values_are_the_seeds() -> None:
    assert reference(DELTA_OLD, X_OLD) == Y_OLD
    assert reference(DELTA_NEW, X_NEW) == Y_NEW


def test_hotswap_trace() -> None:
    sw = build()
    cat = sw.leases.catalog
    assert cat.resolve("tenant-a").generation == 8
    old_handle = SlotHandle(7, 12, 31, "old")
    assert cat.resolve("tenant-a").handle == old_handle

    req_old = sw.leases.bind("request-old", "tenant-a")
    assert req_old.handle == old_handle
    assert sw.leases.residency(req_old).refcount == 1
    assert run_request(sw, req_old, X_OLD) == [float(v) for v in Y_OLD]
    last_use = PendingEvent()
    sw.pool.residents[("old", 1)].note_use(last_use)  # last-use event(slot 7) incomplete

    entry = sw.leases.publish("tenant-a", "new", expected_generation=8, slot=8)
    assert entry.generation == 9
    assert entry.handle == SlotHandle(8, 21, 41, "new")
    req_new = sw.leases.bind("request-new", "tenant-a")
    assert req_new.handle == entry.handle
    assert run_request(sw, req_new, X_NEW) == [float(v) for v in Y_NEW]
    # the old request keeps its lease and its output
    assert run_request(sw, req_old, X_OLD) == [float(v) for v in Y_OLD]
    old_res = sw.leases.residency(req_old)
    new_res = sw.leases.residency(req_new)
    assert old_res.state is ResidencyState.RETIRING and new_res.state is ResidencyState.ACTIVE
    assert sw.pool.slots.state(7) is SlotState.RETIRING
    with pytest.raises(NotResident):  # a retiring generation takes no new binds
        sw.pool.acquire(old_res)

    # refcount 0 is not enough: the last-use event must complete too
    sw.leases.release("request-old", last_use=PendingEvent())
    assert sw.pool.reclaim_retired() == []
    assert sw.pool.slots.state(7) is SlotState.RETIRING
    last_use.synchronize()
    for ev in list(old_res.events):
        ev.synchronize()
    sw.pool.live_generations()  # prune completed launches
    assert sw.pool.reclaim_retired() == [("old", 1)]
    assert sw.pool.slots.state(7) is SlotState.FREE
    assert sw.pool.slots.generations(7) == (13, 32)
    with pytest.raises(StaleGeneration):
        sw.leases.begin_launch([req_old])
    sw.pool.check()


def test_copy_failure_before_publication_leaves_generation_8() -> None:
    sw = build()
    req_old = sw.leases.bind("request-old", "tenant-a")
    sw.faults.arm(FaultPoint.COPY, FaultSpec(FaultAction.FAIL, after_pages=1))
    with pytest.raises(InjectedFault):
        sw.leases.publish("tenant-a", "new", expected_generation=8, slot=8)
    cat = sw.leases.catalog.resolve("tenant-a")
    assert (cat.generation, cat.handle) == (8, SlotHandle(7, 12, 31, "old"))
    assert run_request(sw, req_old, X_OLD) == [float(v) for v in Y_OLD]
    assert sw.pool.slots.state(8) is SlotState.FREE
    assert sw.pool.slots.generations(8) == (22, 41)  # bumped past the shadow's (21, 40)
    assert sw.pool.visible("new") is None
    with pytest.raises(StaleGeneration):
        sw.pool.begin_launch([SlotHandle(8, 21, 41, "new")])
    assert sw.leases.bind("request-2", "tenant-a").handle.slot_id == 7
    sw.pool.check()


def test_slot_binding_digest_changes_with_every_generation() -> None:
    from dataplane.pool.leases import slot_binding

    sem, kern = "1" * 64, "2" * 64
    a = slot_binding(SlotHandle(7, 12, 31, "old"), worker_epoch=1, device_id="cuda:0",
                     adapter_semantic=sem, kernel_local=kern)
    b = slot_binding(SlotHandle(7, 13, 32, "old"), worker_epoch=1, device_id="cuda:0",
                     adapter_semantic=sem, kernel_local=kern)
    assert (a.slot_index, a.slot_generation, a.pointer_table_generation) == (7, 12, 31)
    assert a.sha256 != b.sha256


def test_retired_alias_refuses_new_binds_while_old_lease_finishes() -> None:
    from dataplane.pool.errors import AliasRetired, UnknownAlias

    sw = build()
    lease = sw.leases.bind("request-old", "tenant-a")
    sw.leases.retire_alias("tenant-a")
    with pytest.raises(AliasRetired):
        sw.leases.bind("request-new", "tenant-a")
    with pytest.raises(UnknownAlias):
        sw.leases.bind("request-new", "never-published")
    assert run_request(sw, lease, X_OLD) == [float(v) for v in Y_OLD]
    sw.leases.release("request-old")
    for res in list(sw.pool.residents.values()):
        for ev in res.events:
            ev.synchronize()
    sw.pool.live_generations()
    assert sw.pool.reclaim_retired() == [("old", 1)]
    assert sw.pool.residents == {} and sw.pool.pages.num_free == 32
    sw.pool.check()


def test_cold_bind_loads_jointly_with_kv() -> None:
    sw = build()
    res = sw.pool.visible("old")
    assert res is not None
    sw.pool.evict(res)  # idle alias target evicted by pressure
    lease = sw.leases.bind("r", "tenant-a", kv_initial=2, kv_growth=1)
    assert lease.handle != SlotHandle(7, 12, 31, "old") and len(lease.kv_pages) == 3
    assert run_request(sw, lease, X_OLD) == [float(v) for v in Y_OLD]
    sw.pool.check()


def test_pointer_table_readers_see_old_or_new_whole_mapping() -> None:
    sw = build()
    old = sw.pool.slots.table
    before = dict(old.entries)
    sw.leases.publish("tenant-a", "new", slot=8)
    new = sw.pool.slots.table
    assert dict(old.entries) == before and 8 not in old.entries  # old snapshot untouched
    # slot 7 had no lease and no pending event: retired and reclaimed in the same swap
    assert new.generation > old.generation and set(new.entries) == {8}
    with pytest.raises(TypeError):
        old.entries[8] = new.entries[8]  # type: ignore[index]
