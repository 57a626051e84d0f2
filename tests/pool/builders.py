"""Builders shared by the pool tests: small adapters and the sixteen-page example."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import torch

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.faults import FaultInjector
from dataplane.pool.host_tier import HostTier
from dataplane.pool.packing import Factors, PackedAdapter, pack_adapter
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.page_pool import AdapterOwner, KvOwner
from dataplane.pool.residency import Residency
from dataplane.pool.transactions import LoadRequest, admit

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")

# sixteen-page example: H = 8 elements, L = 2 layers, b = 2 bytes, paired slot = 2*L*H*b = 64 bytes
H, L, B = 8, 2, 2
SLORA_GEOMETRY = PageGeometry(page_elems=2 * L * H, elem_bytes=B)


def square_factors(seed: int, hidden: int, layers: int, rank: int,
                   modules: tuple[str, ...] = ATTENTION) -> Factors:
    """Deterministic factors with small dyadic values (exact in fp16), never all zero."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(layers):
        for m in modules:
            a = (torch.randint(-8, 9, (rank, hidden), generator=g) / 8).float()
            b = (torch.randint(-8, 9, (hidden, rank), generator=g) / 8).float()
            a[0, 0], b[0, 0] = 1.0 + seed, -1.0 - seed  # distinct per adapter
            out[(layer, m)] = (a, b, Fraction(1, 2))
    return out


def packed(key: str, seed: int, geometry: PageGeometry = SLORA_GEOMETRY, rank: int = 1,
           dtype: torch.dtype = torch.float16, hidden: int = H, layers: int = L,
           modules: tuple[str, ...] = ATTENTION) -> PackedAdapter:
    return pack_adapter(key, square_factors(seed, hidden, layers, rank, modules), geometry,
                        dtype)


@dataclass
class SixteenSlot:
    pool: DevicePool
    images: dict[str, PackedAdapter]

    def res(self, key: str) -> Residency:
        found = self.pool.visible(key)
        assert found is not None, key
        return found

    def ownership(self) -> dict[object, tuple[int, ...]]:
        return {o: self.pool.pages.pages_of(o) for o in self.pool.pages.owners()}


def sixteen_slot_fixture(faults: FaultInjector | None = None) -> SixteenSlot:
    """The sixteen-page example's initial ownership, built through the public API.

    slots 0..3 KV r0 (active); 4..7 adapter a (refcount 1, pin 1); 8..11 adapter b
    (idle, unpinned, host-backed, generation 4 so that its restore is b@g5); 12..15 free.
    """
    images = {k: packed(k, i) for i, k in enumerate("abc")}
    host = HostTier(byte_budget=1 << 20, pin_memory=False)
    for img in images.values():
        host.put(img)
    pool = DevicePool(SLORA_GEOMETRY, 16, num_slots=4, dtype=torch.float16, host_tier=host,
                      faults=faults, last_generations={"b": 3})
    assert pool.allocate_kv("r0", 4) == (0, 1, 2, 3)
    admit(pool, LoadRequest("a", request_id="ra#1"))
    admit(pool, LoadRequest("b"))
    fx = SixteenSlot(pool, images)
    pool.pin(fx.res("a"))
    assert fx.ownership() == {
        KvOwner("r0"): (0, 1, 2, 3),
        AdapterOwner("a", 1): (4, 5, 6, 7),
        AdapterOwner("b", 4): (8, 9, 10, 11),
    }
    return fx
