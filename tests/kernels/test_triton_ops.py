"""Triton-specific contracts on the CPU: custom-op registration (fake impls),
the device metadata sort against torch's stable sort, typed input errors."""

from __future__ import annotations

import functools

import pytest
import torch

from dataplane.kernels import (
    LoraFactorTable,
    LoraMetaBuffers,
    LoraShapeError,
    LoraWorkspace,
    get_lora_backend,
)

from .conftest import CPU_BACKENDS, make_cpu_backend

# Triton runs on CUDA when there is a device, else on the CPU interpreter
# (conftest sets TRITON_INTERPRET=1 whenever CUDA is absent).
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    ("num_rows", "num_slots"), [(1, 1), (37, 5), (300, 70), (129, 200), (16500, 3)]
)
def test_meta_sort_matches_torch_stable_sort(num_rows: int, num_slots: int) -> None:
    from dataplane.kernels.torch_backend import build_meta_torch
    from dataplane.kernels.triton.meta_kernel import build_meta_triton

    gen = torch.Generator().manual_seed(num_rows)
    row_slot = torch.randint(-1, num_slots, (num_rows,), generator=gen, dtype=torch.int32)
    builders = [build_meta_torch] + [
        functools.partial(build_meta_triton, method=m)
        for m in ("pairwise", "sort", "chunked")
        if (m != "pairwise" or num_rows <= 256) and (num_rows <= 16384 or m == "chunked")
    ]
    if TRITON_DEVICE != "cpu":
        row_slot = row_slot.to(TRITON_DEVICE)
    for build in builders:
        dev = "cpu" if build is build_meta_torch else TRITON_DEVICE
        meta = build(row_slot.to(dev), LoraMetaBuffers(num_rows + 5, num_slots, dev))
        row_slot_cpu = row_slot.cpu()
        key = torch.where(row_slot_cpu < 0, num_slots, row_slot_cpu.long())
        assert meta.sorted_rows.tolist() == torch.sort(key, stable=True).indices.tolist()
        counts = torch.bincount(key, minlength=num_slots + 1)[:num_slots]
        assert meta.slot_counts.tolist() == counts.tolist()
        assert meta.slot_starts.tolist() == (torch.cumsum(counts, 0) - counts).tolist()
        assert meta.row_slot.tolist() == row_slot_cpu.tolist()


def test_custom_ops_pass_opcheck(monkeypatch: pytest.MonkeyPatch) -> None:
    from .lora_cases import enable_folded_silu

    enable_folded_silu(monkeypatch)
    dev = TRITON_DEVICE
    backend = get_lora_backend(dev, prefer="triton")
    table = LoraFactorTable(3, 32, (16, 8), max_rank=16, dtype=torch.float32, device=dev)
    for s in range(3):
        table.set_slot(s, {0: (torch.randn(4, 32), torch.randn(16, 4), 0.5)})
    meta = backend.build_meta(
        torch.tensor([0, 2, -1, 1, 0], dtype=torch.int32, device=dev), LoraMetaBuffers(5, 3, dev)
    )
    w = table.weights
    ws = LoraWorkspace(backend.workspace_numel(5, 2, 16), dev)
    x = torch.randn(5, 32, device=dev)
    z = backend.shrink(x, meta, w, ws)
    shrink_args = (x, w.storage, w.a_rows, w.ranks, meta.sorted_rows, meta.slot_counts,
                   meta.slot_starts, z, w.addr_align)  # fmt: skip
    torch.library.opcheck(
        torch.ops.adapterplane.lora_shrink.default,
        shrink_args,
        test_utils=("test_schema", "test_faketensor"),
    )
    y = torch.randn(5, 24, device=dev)
    expand_args = (y, z, w.storage, w.b_rows, w.ranks, w.scales, meta.sorted_rows,
                   meta.slot_counts, meta.slot_starts, list(w.out_features),
                   w.addr_align)  # fmt: skip
    torch.library.opcheck(
        torch.ops.adapterplane.lora_expand.default,
        expand_args,
        test_utils=("test_schema", "test_faketensor"),
    )
    fused_args = (y, x, w.storage, w.a_rows, w.b_rows, w.ranks, w.scales, meta.sorted_rows,
                  meta.slot_counts, meta.slot_starts, ws.buffer, ws.counters,
                  list(w.out_features), w.addr_align)  # fmt: skip
    torch.library.opcheck(
        torch.ops.adapterplane.lora_fused.default,
        fused_args,
        test_utils=("test_schema", "test_faketensor"),
    )
    table2 = LoraFactorTable(3, 32, (12, 12), max_rank=16, dtype=torch.float32, device=dev)
    table2.set_slot(1, {0: (torch.randn(4, 32), torch.randn(12, 4), 0.5)})
    w2 = table2.weights
    z2 = backend.shrink(x, meta, w2, ws)
    silu_args = (torch.randn(5, 24, device=dev), torch.empty(5, 12, device=dev), z2,
                 w2.storage, w2.b_rows, w2.ranks, w2.scales, meta.sorted_rows,
                 meta.slot_counts, meta.slot_starts, w2.addr_align)  # fmt: skip
    torch.library.opcheck(
        torch.ops.adapterplane.lora_expand_silu.default,
        silu_args,
        test_utils=("test_schema", "test_faketensor"),
    )


def test_bad_shapes_raise_typed_errors_and_change_nothing() -> None:
    for name in CPU_BACKENDS:
        backend = make_cpu_backend(name)
        table = LoraFactorTable(2, 16, (8,), max_rank=4, dtype=torch.float32, device="cpu")
        table.set_slot(0, {0: (torch.randn(4, 16), torch.randn(8, 4), 1.0)})
        meta = backend.build_meta(
            torch.tensor([0, 1, 0], dtype=torch.int32), LoraMetaBuffers(3, 2, "cpu")
        )
        y = torch.randn(3, 8)
        before = y.clone()
        with pytest.raises(LoraShapeError) as err:
            backend.add_lora(y, torch.randn(3, 15), meta, table.weights)
        assert err.value.code == "lora_shape_mismatch"
        with pytest.raises(LoraShapeError):
            backend.add_lora(y, torch.randn(3, 16, dtype=torch.float64), meta, table.weights)
        with pytest.raises(LoraShapeError):
            backend.add_lora(y[:, :7], torch.randn(3, 16), meta, table.weights)
        assert torch.equal(y, before)


def test_factor_table_rejects_bad_slots_without_writing() -> None:
    from dataplane.kernels import LoraRankError, LoraSlotError

    table = LoraFactorTable(2, 16, (8,), max_rank=4, dtype=torch.float32, device="cpu")
    table.set_slot(1, {0: (torch.ones(2, 16), torch.ones(8, 2), 1.0)})
    storage, ranks = table.storage.clone(), table.ranks.clone()
    with pytest.raises(LoraSlotError):
        table.set_slot(2, {0: (torch.ones(2, 16), torch.ones(8, 2), 1.0)})
    with pytest.raises(LoraRankError):
        table.set_slot(1, {0: (torch.ones(5, 16), torch.ones(8, 5), 1.0)})
    with pytest.raises(LoraShapeError):
        table.set_slot(1, {0: (torch.ones(2, 16), torch.ones(7, 2), 1.0)})
    assert torch.equal(table.storage, storage) and torch.equal(table.ranks, ranks)
    table.clear_slot(1)
    assert int(table.ranks.sum()) == 0 and not table.storage.any()
