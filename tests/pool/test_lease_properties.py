"""Hypothesis: leases survive any interleaving of republish, binds, launches and faults.

Properties after every step: a held lease's handle still validates (an old request
never loses its generation to a hotswap) and its pages hold its own adapter's bytes;
the alias resolves to a visible generation; pool conservation holds; a handle whose
lease ended and whose slot was reclaimed never validates again.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.errors import PoolError, StaleGeneration
from dataplane.pool.events import PendingEvent
from dataplane.pool.faults import FaultAction, FaultInjector, FaultPoint, FaultSpec
from dataplane.pool.host_tier import HostTier
from dataplane.pool.leases import AliasCatalog, Lease, LeaseManager
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.residency import VISIBLE
from dataplane.pool.slot_table import SlotHandle

from .builders import packed

GEO = PageGeometry(page_elems=32, elem_bytes=2)
KEYS = ("k0", "k1", "k2", "k3")
ALIASES = ("t1", "t2")

publish_st = st.tuples(st.just("publish"), st.sampled_from(ALIASES), st.sampled_from(KEYS),
                       st.sampled_from((None, None, None, "copy", "validate", "publish")))
op_st = st.one_of(
    publish_st, publish_st, publish_st,
    st.tuples(st.just("bind"), st.sampled_from(ALIASES)),
    st.tuples(st.just("bind"), st.sampled_from(ALIASES)),
    st.tuples(st.just("release"), st.integers(0, 5)),
    st.tuples(st.just("launch"), st.integers(0, 5)),
    st.tuples(st.just("complete"),),
)


class World:
    def __init__(self) -> None:
        self.images = {k: packed(k, i, GEO) for i, k in enumerate(KEYS)}
        host = HostTier(1 << 20, pin_memory=False)
        for img in self.images.values():
            host.put(img)
        self.faults = FaultInjector()
        self.pool = DevicePool(GEO, 16, 3, torch.float16, host_tier=host, faults=self.faults)
        self.leases = LeaseManager(self.pool, AliasCatalog())
        self.held: list[Lease] = []
        self.ended: list[SlotHandle] = []
        self.events: list[PendingEvent] = []
        self.n = 0
        self.leases.publish("t1", "k0")
        self.leases.publish("t2", "k1")

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "publish":
            _, alias, key, fault = op
            self.faults.disarm()
            if fault is not None:
                self.faults.arm(FaultPoint(fault), FaultSpec(FaultAction.FAIL, after_pages=1))
            try:
                self.leases.publish(alias, key, fresh=True)
            finally:
                self.faults.disarm()
        elif kind == "bind":
            self.n += 1
            self.held.append(self.leases.bind(f"req{self.n}", op[1]))
        elif kind in ("release", "launch") and self.held:
            lease = self.held[op[1] % len(self.held)]
            ev = PendingEvent()
            self.events.append(ev)
            if kind == "release":
                self.held.remove(lease)
                self.leases.release(lease.request_id, ev)
                self.ended.append(lease.handle)
            else:
                snap = self.leases.begin_launch([lease])
                self.leases.end_launch(snap, ev)
        elif kind == "complete":
            for ev in self.events:
                ev.synchronize()
            self.events.clear()
            self.pool.reclaim_retired()

    def check(self) -> None:
        self.pool.check()
        table = self.pool.slots.table
        for lease in self.held:
            entry = table.resolve(lease.handle)  # raises if the lease lost its slot
            data = self.pool.storage.read(entry.pages)
            assert torch.equal(data, self.images[lease.handle.artifact_digest].payload)
        for alias in ALIASES:  # the alias's artifact, if resident, is whole and bindable
            res = self.pool.visible(self.leases.catalog.resolve(alias).key)
            if res is not None:
                assert res.state in VISIBLE
                data = self.pool.storage.read(res.pages)
                assert torch.equal(data, self.images[res.key].payload)
        live = {lease.handle for lease in self.held}
        for handle in self.ended:
            if handle in live:
                continue
            res = [r for r in self.pool.residents.values() if r.slot == handle.slot_id]
            if not res:  # slot reclaimed or reused: the old handle must be dead for good
                try:
                    table.resolve(handle)
                except StaleGeneration:
                    continue
                raise AssertionError(f"reclaimed handle {handle} still validates")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, min_size=1, max_size=30))
def test_leases_hold_across_hotswaps(ops: list[tuple[Any, ...]]) -> None:
    world = World()
    for op in ops:
        with contextlib.suppress(PoolError):
            world.apply(op)
        world.check()
