"""Hypothesis: conservation and integrity over random operation sequences, failed or not.

After every operation (including ones that raise a typed pool error) the pool must
conserve pages, agree across its indexes, and every published adapter's pages must hold
exactly its verified host bytes (so a rollback that "restored" a victim really did).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import PoolError
from dataplane.pool.events import PendingEvent
from dataplane.pool.faults import FaultAction, FaultInjector, FaultPoint, FaultSpec
from dataplane.pool.host_tier import HostTier
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.page_pool import AdapterOwner, KvOwner
from dataplane.pool.residency import VISIBLE, ResidencyState
from dataplane.pool.transactions import LoadRequest, LoadTransaction

from .builders import packed

GEO = PageGeometry(page_elems=32, elem_bytes=2)
KEYS = ("a", "b", "c", "d", "e")
RANKS = {"a": 1, "b": 2, "c": 1, "d": 3, "e": 1}  # 4, 8, 4, 12, 4 pages
TOTAL = 24

key_st = st.sampled_from(KEYS)
req_st = st.sampled_from(("r1", "r2", "r3", "r4"))
fault_st = st.sampled_from((None, None, None, "copy_fail", "validate_fail", "publish_fail",
                            "cancel"))
admit_st = st.tuples(st.just("admit"), key_st, req_st, st.integers(0, 3), st.integers(0, 2),
                     fault_st, st.integers(0, 12))
op_st = st.one_of(
    admit_st, admit_st, admit_st,
    st.tuples(st.just("prefetch"), key_st, fault_st),
    st.tuples(st.just("prefetch"), key_st, fault_st),
    st.tuples(st.just("finish"), req_st),
    st.tuples(st.just("grow"), req_st, st.integers(2, 10)),
    st.tuples(st.just("pin"), key_st, st.booleans()),
    st.tuples(st.just("queue"), key_st, st.booleans()),
    st.tuples(st.just("retire"), key_st),
    st.tuples(st.just("launch"), key_st),
    st.tuples(st.just("complete"),),
    st.tuples(st.just("drop_host"), key_st, st.integers(0, 3)),
)


class World:
    def __init__(self) -> None:
        self.images = {k: packed(k, i, GEO, rank=RANKS[k]) for i, k in enumerate(KEYS)}
        self.host = HostTier(1 << 20, pin_memory=False)
        for img in self.images.values():
            self.host.put(img)
        self.faults = FaultInjector()
        self.pool = DevicePool(GEO, TOTAL, 4, torch.float16, host_tier=self.host,
                               faults=self.faults)
        self.bound: dict[str, tuple[str, int]] = {}  # request -> (key, generation)
        self.events: list[PendingEvent] = []

    def arm(self, fault: str | None, after: int = 0) -> None:
        self.faults.disarm()
        if fault == "copy_fail":
            self.faults.arm(FaultPoint.COPY, FaultSpec(FaultAction.FAIL, after_pages=after))
        elif fault == "validate_fail":
            self.faults.arm(FaultPoint.VALIDATE, FaultSpec(FaultAction.FAIL))
        elif fault == "publish_fail":
            self.faults.arm(FaultPoint.PUBLISH, FaultSpec(FaultAction.FAIL))

    def load(self, req: LoadRequest, fault: str | None, after: int = 0) -> None:
        self.arm(fault, after)
        txn = LoadTransaction(self.pool, req)
        if fault == "cancel":
            txn.begin()
            txn.start_copy()
            txn.abort()
        else:
            adm = txn.run()
            if req.request_id is not None:
                self.bound[req.request_id] = (adm.key, adm.generation)
        self.faults.disarm()

    def apply(self, op: tuple[Any, ...]) -> None:
        pool, kind = self.pool, op[0]
        if kind == "admit":
            _, key, rid, kv0, kvg, fault, after = op
            if rid in self.bound:
                return
            self.load(LoadRequest(key, rid, kv0, kvg), fault, after)
        elif kind == "prefetch":
            self.load(LoadRequest(op[1]), op[2])
        elif kind == "finish" and op[1] in self.bound:
            res = pool.residents[self.bound.pop(op[1])]
            ev = PendingEvent()
            self.events.append(ev)
            pool.release_ref(res, ev)
            if pool.pages.pages_of(KvOwner(op[1])):
                pool.free_kv(op[1])
        elif kind == "grow":
            pool.allocate_kv(op[1], op[2])
        elif kind in ("pin", "queue", "retire", "launch"):
            res = pool.visible(op[1])
            if res is None:
                return
            if kind == "pin":
                pool.pin(res) if op[2] or not res.pin_count else pool.unpin(res)
            elif kind == "queue":
                (pool.hold_for_queue(res) if op[2] or not res.queued_reservations
                 else pool.release_queue_hold(res))
            elif kind == "retire":
                pool.retire(res)
            else:
                assert res.slot is not None
                snap = pool.begin_launch([pool.slots.table.entries[res.slot].handle])
                ev = PendingEvent()
                self.events.append(ev)
                pool.end_launch(snap, ev)
        elif kind == "complete":
            for ev in self.events:
                ev.synchronize()
            self.events.clear()
            pool.reclaim_retired()
        elif kind == "drop_host" and op[2] == 0:  # rare: a host copy is evicted
            self.host.discard(op[1])

    def check(self) -> None:
        counts = self.pool.check()
        assert counts.free + counts.reserved + counts.adapter + counts.kv == TOTAL
        assert counts.reserved == 0  # no transaction left open
        for (key, gen), res in self.pool.residents.items():
            assert res.state in (*VISIBLE, ResidencyState.RETIRING)
            assert self.pool.pages.pages_of(AdapterOwner(key, gen)) == res.pages
            assert torch.equal(self.pool.storage.read(res.pages), self.images[key].payload)
        for rid, bound in self.bound.items():
            assert bound in self.pool.residents, rid
            assert self.pool.residents[bound].refcount >= 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, min_size=1, max_size=30))
def test_conservation_after_every_operation(ops: list[tuple[Any, ...]]) -> None:
    world = World()
    for op in ops:
        with contextlib.suppress(PoolError):  # typed refusal / injected fault: still whole
            world.apply(op)
        world.check()
