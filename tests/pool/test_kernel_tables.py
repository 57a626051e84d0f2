"""Page placement produces exactly the kernels' row-address tables (no copies)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from dataplane.kernels.base import LoraMetaBuffers
from dataplane.kernels.reference import lora_delta_reference
from dataplane.kernels.torch_backend import TorchLoraBackend
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.host_tier import HostTier
from dataplane.pool.kernel_tables import KernelTables, ModuleGroup
from dataplane.pool.packing import pack_adapter
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.transactions import LoadRequest, admit

D_IN, WIDTHS = 8, (8, 4, 4)  # fused q/k/v with GQA widths
SLICES = ("q_proj", "k_proj", "v_proj")


def factors(seed: int, rank: int, present: tuple[str, ...]) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(2):
        for name, w in zip(SLICES, WIDTHS, strict=True):
            if name in present:
                a = torch.randn(rank, D_IN, generator=g)
                b = torch.randn(w, rank, generator=g)
                out[(layer, name)] = (a, b, Fraction(seed + 1, 4))
    return out


def test_tables_drive_the_kernel_to_the_float64_reference() -> None:
    geo = PageGeometry(page_elems=20, elem_bytes=4)  # not a multiple of widths: tails exist
    host = HostTier(1 << 20, pin_memory=False)
    specs = {"x": factors(1, 2, SLICES), "y": factors(2, 3, ("q_proj", "v_proj")),
             "z": factors(3, 1, ("k_proj",))}
    for key, f in specs.items():
        host.put(pack_adapter(key, f, geo, torch.float32, physical_rank=4 if key == "z" else None))
    pool = DevicePool(geo, 64, 4, torch.float32, host_tier=host)
    groups = [ModuleGroup(layer, "qkv", SLICES, D_IN, WIDTHS) for layer in range(2)]
    tables = KernelTables(pool.storage, groups, 4, max_rank=4)
    pool.listeners.append(tables)
    slots = {key: admit(pool, LoadRequest(key)).handle.slot_id for key in specs}
    pool.check()

    backend = TorchLoraBackend()
    row_slot = [slots["x"], -1, slots["y"], slots["z"], slots["x"], slots["z"]]
    x = torch.randn(len(row_slot), D_IN, generator=torch.Generator().manual_seed(9))
    for layer in range(2):
        w = tables.weights(layer, "qkv")
        w.validate()
        assert w.storage.data_ptr() == pool.storage.data.data_ptr()  # the pool itself
        y = torch.zeros(len(row_slot), sum(WIDTHS))
        meta = backend.build_meta(torch.tensor(row_slot), LoraMetaBuffers(8, 4, "cpu"))
        backend.add_lora(y, x, meta, w)
        ref_factors = {
            slots[key]: {SLICES.index(m): (a, b, float(s))
                         for (lay, m), (a, b, s) in f.items() if lay == layer}
            for key, f in specs.items()
        }
        ref = lora_delta_reference(x, row_slot, ref_factors, WIDTHS)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(y[1], torch.zeros(sum(WIDTHS)))  # base row: exact zero delta

    # reclaiming a slot zeroes its ranks: exact zero delta, no stale rows
    res = pool.visible("y")
    assert res is not None
    pool.retire(res)
    w = tables.weights(0, "qkv")
    assert int(w.ranks[:, slots["y"]].abs().sum()) == 0
    y = torch.zeros(1, sum(WIDTHS))
    meta = backend.build_meta(torch.tensor([slots["y"]]), LoraMetaBuffers(8, 4, "cpu"))
    backend.add_lora(y, x[:1], meta, w)
    assert torch.equal(y, torch.zeros_like(y))


def test_adapter_module_without_a_kernel_call_site_is_never_published() -> None:
    from dataplane.pool.errors import LayoutError

    geo = PageGeometry(page_elems=16, elem_bytes=4)
    host = HostTier(1 << 20, pin_memory=False)
    bad = factors(1, 2, SLICES)
    bad[(0, "gate_proj")] = (torch.ones(2, D_IN), torch.ones(8, 2), Fraction(1))
    host.put(pack_adapter("bad", bad, geo, torch.float32))
    pool = DevicePool(geo, 64, 2, torch.float32, host_tier=host)
    tables = KernelTables(pool.storage, [ModuleGroup(0, "qkv", SLICES, D_IN, WIDTHS),
                                         ModuleGroup(1, "qkv", SLICES, D_IN, WIDTHS)], 2, 4)
    pool.listeners.append(tables)
    with pytest.raises(LayoutError, match="no kernel call site"):
        admit(pool, LoadRequest("bad"))
    assert pool.slots.table.entries == {} and pool.residents == {}
    assert int(tables.weights(0, "qkv").ranks.abs().sum()) == 0
    assert pool.pages.num_free == 64
    pool.check()


@pytest.mark.parametrize(("slices", "page_elems", "align"), [
    (SLICES, 20, 4), (SLICES, 48, 4), (("q_proj",), 20, 4), (("q_proj",), 32, 8),
    (("q_proj",), 48, 8)])
def test_row_addresses_keep_the_alignment_the_tables_promise(
        slices: tuple[str, ...], page_elems: int, align: int) -> None:
    """`addr_align` (the kernels' licence for wide vector loads) is the largest power of
    two up to 16 dividing the page size and every slice width (gcd(page, 8, 4, 4) with
    q/k/v, gcd(page, 8) with q alone). Every published rank row's address is a multiple of
    it, on every page."""
    geo = PageGeometry(page_elems=page_elems, elem_bytes=4)
    host = HostTier(1 << 20, pin_memory=False)
    specs = {"x": factors(1, 3, slices), "y": factors(2, 4, slices[:1]),
             "z": factors(3, 1, slices[-1:])}
    for key, f in specs.items():
        host.put(pack_adapter(key, f, geo, torch.float32))
    pool = DevicePool(geo, 64, 4, torch.float32, host_tier=host)
    widths = tuple(WIDTHS[SLICES.index(n)] for n in slices)
    groups = [ModuleGroup(layer, "qkv", slices, D_IN, widths) for layer in range(2)]
    tables = KernelTables(pool.storage, groups, 4, max_rank=4)
    pool.listeners.append(tables)
    for key in specs:
        admit(pool, LoadRequest(key))
    assert tables.addr_align == align
    live = 0
    for layer in range(2):
        w = tables.weights(layer, "qkv")
        assert w.addr_align == align
        for rows in (w.a_rows, w.b_rows):
            used = torch.arange(4)[None, None, :] < w.ranks[:, :, None]
            live += int(used.sum())
            assert not (rows[used] % align).any()
    assert live > 0
