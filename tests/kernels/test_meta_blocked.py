"""The multi-program (blocked) metadata build against a pure-torch reference.

Reference: ``torch.sort(stable=True)`` of the bucket keys (slot ``-1`` → bucket
``S``) and ``torch.bincount`` — independent of the kernels. Small blocks (16,
32 rows) give many programs at interpreter-friendly sizes; the large-T cases
with the default block run on the GPU (``test_gpu.py``).
"""

from __future__ import annotations

import pytest
import torch

from dataplane.kernels import LoraMetaBuffers, LoraShapeError

TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(row_slot: torch.Tensor, num_slots: int) -> tuple[list[int], list[int], list[int]]:
    key = torch.where(row_slot < 0, num_slots, row_slot.long())
    counts = torch.bincount(key, minlength=num_slots + 1)[:num_slots]
    order = torch.sort(key, stable=True).indices
    return order.tolist(), counts.tolist(), (torch.cumsum(counts, 0) - counts).tolist()


def draw(dist: str, num_rows: int, num_slots: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dist == "none":  # every row without an adapter
        return torch.full((num_rows,), -1, dtype=torch.int32)
    if dist == "identical":
        return torch.full((num_rows,), num_slots - 1, dtype=torch.int32)
    if dist == "descending":  # worst case for a stable order: every block reversed
        return torch.tensor([num_slots - 1 - t * num_slots // num_rows for t in range(num_rows)],
                            dtype=torch.int32)  # fmt: skip
    if dist == "zipf":
        w = 1.0 / torch.arange(1, num_slots + 1, dtype=torch.float64) ** 1.5
        s = torch.multinomial(w, num_rows, replacement=True, generator=gen)
        none = torch.rand(num_rows, generator=gen) < 0.2
        return torch.where(none, -1, s).to(torch.int32)
    # "uniform": slots and -1 rows mixed
    return torch.randint(-1, num_slots, (num_rows,), generator=gen, dtype=torch.int32)


CASES = [  # (T, S, distribution, block)
    (16, 1, "none", 16),  # exactly one block, no active row; S = 1
    (17, 3, "identical", 16),  # a one-row last block
    (64, 5, "descending", 16),
    (100, 40, "uniform", 16),
    (131, 7, "zipf", 32),
    (150, 300, "uniform", 16),  # S_PAD 512: histograms read 8 blocks at a time (NB 10)
]


# Both launch schemes on every case on the GPU; alternating ones in the interpreter.
PARAMS = [
    (method, *case)
    for i, case in enumerate(CASES)
    for method in ("blocked", "blocked1")
    if TRITON_DEVICE == "cuda" or method == ("blocked", "blocked1")[i % 2] or i == 5
]


@pytest.mark.parametrize(("method", "num_rows", "num_slots", "dist", "block"), PARAMS)
def test_blocked_grouping_matches_stable_sort(
    method: str, num_rows: int, num_slots: int, dist: str, block: int
) -> None:
    from dataplane.kernels.triton.meta_kernel import build_meta_triton

    row_slot = draw(dist, num_rows, num_slots, seed=num_rows + num_slots)
    buffers = LoraMetaBuffers(num_rows + 7, num_slots, TRITON_DEVICE, min_block=16)
    buffers.sorted_rows.fill_(-7)  # stale values from an earlier step must not leak
    buffers.slot_counts.fill_(99)
    meta = build_meta_triton(row_slot.to(TRITON_DEVICE), buffers, method, block)
    order, counts, starts = reference(row_slot, num_slots)
    assert meta.sorted_rows.tolist() == order
    assert meta.slot_counts.tolist() == counts
    assert meta.slot_starts.tolist() == starts
    assert meta.row_slot.tolist() == row_slot.tolist()
    assert buffers.sorted_rows[num_rows:].tolist() == [-7] * 7  # nothing past T written


def test_auto_uses_the_blocked_grouping_above_the_sort_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backend's default build switches to the blocked grouping above the
    sort limit (limits lowered so the interpreter runs a few small programs;
    the committed limits run on the GPU in ``test_gpu.py``)."""
    from dataplane.kernels.triton import meta_kernel
    from dataplane.kernels.triton.backend import TritonLoraBackend

    monkeypatch.setattr(meta_kernel, "SORT_AUTO_MAX_ROWS", 32)
    monkeypatch.setattr(meta_kernel, "BLOCKED_ROWS", 16)
    row_slot = draw("zipf", 75, 12, seed=5)
    buffers = LoraMetaBuffers(75, 12, TRITON_DEVICE, min_block=16)
    meta = TritonLoraBackend().build_meta(row_slot.to(TRITON_DEVICE), buffers)
    assert (meta.sorted_rows.tolist(), meta.slot_counts.tolist(), meta.slot_starts.tolist()) == (
        reference(row_slot, 12)
    )
    assert int(buffers.scratch.abs().sum()) > 0  # the per-block histograms were used


def test_blocked_rejects_bad_blocks_and_methods() -> None:
    from dataplane.kernels.triton.meta_kernel import build_meta_triton

    buffers = LoraMetaBuffers(64, 4, TRITON_DEVICE)  # min_block 128
    row_slot = torch.zeros(64, dtype=torch.int32, device=TRITON_DEVICE)
    for method, block in (("blocked", 64), ("blocked1", 192), ("bogus", None)):
        with pytest.raises(LoraShapeError):
            build_meta_triton(row_slot, buffers, method, block)
    with pytest.raises(LoraShapeError):
        LoraMetaBuffers(64, 4, TRITON_DEVICE, min_block=0)
