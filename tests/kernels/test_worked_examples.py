"""Two worked LoRA examples as exact test vectors (every value is a small
dyadic rational, so fp32 arithmetic reproduces them exactly).

Fixed rank: the 8-row segmented trace of two rank-2 adapters and two base rows
(permutation, offsets, Z, D, ΔY, Y).
Variable rank: three adapters of ranks 3, 2 and 1 in one step (ragged Z rows and
D). Z and D were chosen first; X, A and B were then solved by hand so that they
reproduce them exactly.
"""

from __future__ import annotations

import torch

from dataplane.kernels import LoraBackend, LoraFactorTable, LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.reference import lora_delta_reference

F = torch.float32


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F)


# --- Fixed rank: adapters 1, 2 are slots 1, 2; the base rows are slot -1.
ROW_SLOT_GROUPED = [1, 2, 1, -1, 2, 2, 1, -1]
X_G = t([[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1], [0, 1, 1, 0], [1, 0, 0, 1]])
G = [0, 2, 6, 1, 4, 5]
A1, B1, S1 = t([[1, 0, 1, 0], [0, 1, 0, 1]]), t([[1, 0], [0, 1], [1, 1]]), 0.5
A2, B2, S2 = t([[1, 1, 0, 0], [0, 0, 1, 1]]), t([[1, 1], [1, -1], [0, 1]]), 2.0
Z_GROUPED = t([[2, 0], [1, 1], [2, 2], [1, 1], [1, 1], [1, 1]])
D_GROUPED = t([[1, 0, 1], [0.5, 0.5, 1], [1, 1, 2], [4, 0, 2], [4, 0, 2], [4, 0, 2]])
DY_GROUPED = t(
    [[1, 0, 1], [4, 0, 2], [0.5, 0.5, 1], [0, 0, 0], [4, 0, 2], [4, 0, 2], [1, 1, 2], [0, 0, 0]]
)
Y_GROUPED = t(
    [[2, 1, 2], [5, 1, 3], [1.5, 1.5, 3], [3, 0, 2], [4, 2, 3], [6, 0, 3], [3, 3, 4], [1, 2, 0]]
)


def x_grouped() -> torch.Tensor:
    x = torch.full((8, 4), 7.0)  # base-only rows 3, 7: any value, must not matter
    x[G] = X_G
    return x


def test_grouped_example_metadata_permutation_and_offsets(cpu_backend: LoraBackend) -> None:
    meta = cpu_backend.build_meta(
        torch.tensor(ROW_SLOT_GROUPED, dtype=torch.int32), LoraMetaBuffers(8, 3, "cpu")
    )
    assert meta.sorted_rows[:6].tolist() == G  # g = [0, 2, 6, 1, 4, 5]
    assert meta.sorted_rows[6:].tolist() == [3, 7]  # base-only rows last
    assert meta.slot_counts.tolist() == [0, 3, 3]
    starts = meta.slot_starts.tolist()
    assert [starts[1], starts[2], starts[2] + 3] == [0, 3, 6]  # offsets o


def test_grouped_example_shrink_expand_scatter_exact(cpu_backend: LoraBackend) -> None:
    table = LoraFactorTable(3, 4, (3,), max_rank=2, dtype=F, device="cpu")
    table.set_slot(1, {0: (A1, B1, S1)})
    table.set_slot(2, {0: (A2, B2, S2)})
    x = x_grouped()
    meta = cpu_backend.build_meta(
        torch.tensor(ROW_SLOT_GROUPED, dtype=torch.int32), LoraMetaBuffers(8, 3, "cpu")
    )
    ws = LoraWorkspace(cpu_backend.workspace_numel(8, 1, 2), "cpu")
    z_parts = cpu_backend.shrink(x, meta, table.weights, ws)
    assert z_parts.shape[0] == 1  # K = 4 fits one tile: z[0] is the bottleneck
    z = z_parts[0, :, 0, :]
    assert torch.equal(z[G], Z_GROUPED)

    base = Y_GROUPED - DY_GROUPED  # the fixture's X W^T
    y = base.clone()
    cpu_backend.expand(y, cpu_backend.shrink(x, meta, table.weights, ws), meta, table.weights)
    assert torch.equal((y - base)[G], D_GROUPED)
    assert torch.equal(y - base, DY_GROUPED)
    assert torch.equal(y, Y_GROUPED)
    assert torch.equal(y[[3, 7]], base[[3, 7]])  # base-only rows untouched


# --- Variable rank: packed rows [b, b, a, a, a, a, base, c]; ranks b=3, a=2, c=1; d_in 3, d_out 2.
SLOT_A, SLOT_B, SLOT_C = 0, 1, 2
ROW_SLOT_RAGGED = [SLOT_B, SLOT_B, SLOT_A, SLOT_A, SLOT_A, SLOT_A, -1, SLOT_C]
X_RAGGED = t([[1, 1, 1], [2, -1, -1], [1, -1, 1], [0, 1, 1], [1, 1, 1], [2, -3, 1], [5, 5, 5],
            [1, 0, 0]])  # fmt: skip
FACTORS_RAGGED = {
    SLOT_A: (t([[1, 0, 1], [0, 1, 0]]), t([[1, 2], [-1, 1]]), 0.5),
    SLOT_B: (t([[1, 0, 0], [1, 1, 0], [0, 0, -1]]), t([[1, 0, 1], [-1, 2, 0]]), 1.0),
    SLOT_C: (t([[1, 1, 1]]), t([[2], [1]]), 2.0),
}
Z_PER_ROW_RAGGED = [[1, 2, -1], [2, 1, 1], [2, -1], [1, 1], [2, 1], [3, -3], [], [1]]
D_RAGGED = t([[0, 3], [3, 0], [0, -1.5], [1.5, 0], [2, -0.5], [-1.5, -3], [0, 0], [4, 2]])


def test_ragged_ranks_example_exact(cpu_backend: LoraBackend) -> None:
    table = LoraFactorTable(3, 3, (2,), max_rank=4, dtype=F, device="cpu", layout="scattered")
    for slot, f in FACTORS_RAGGED.items():
        table.set_slot(slot, {0: f})
    meta = cpu_backend.build_meta(
        torch.tensor(ROW_SLOT_RAGGED, dtype=torch.int32), LoraMetaBuffers(8, 3, "cpu")
    )
    ws = LoraWorkspace(cpu_backend.workspace_numel(8, 1, 4), "cpu")
    z_parts = cpu_backend.shrink(X_RAGGED, meta, table.weights, ws)
    assert z_parts.shape[0] == 1
    z = z_parts[0, :, 0, :]
    for row, slot in enumerate(ROW_SLOT_RAGGED):
        r = 0 if slot < 0 else FACTORS_RAGGED[slot][0].shape[0]
        assert z[row, :r].tolist() == Z_PER_ROW_RAGGED[row]

    y = torch.zeros(8, 2)
    cpu_backend.add_lora(y, X_RAGGED, meta, table.weights, ws)
    assert torch.equal(y, D_RAGGED)
    ref = lora_delta_reference(
        X_RAGGED, ROW_SLOT_RAGGED, {s: {0: f} for s, f in FACTORS_RAGGED.items()}, (2,)
    )
    assert torch.equal(ref.float(), D_RAGGED)
