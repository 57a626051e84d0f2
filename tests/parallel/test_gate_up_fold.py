"""The column-parallel gate/up shard folds its LoRA expand into SiLU·mul, as on one GPU.

Two real gloo ranks, gate/up 16 -> 2 x 24 (each rank 12 + 12 columns), three adapters of
mixed ranks (one without up_proj), rows of every slot and rows without one. Reference:
float64 ``silu(x Wg^T + s (x Ag^T) Bg^T) * (x Wu^T + s (x Au^T) Bu^T)`` per row, written
here. Default layout: the backend's fold runs on the rank's shard (no collective); the
paper layout never folds (its expand follows the all-gather) and still matches.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from dataplane.parallel import LAYOUT_LOCAL, LAYOUT_PAPER

from .dist_harness import run_world

HIDDEN, INTER = 16, 24
ROW_SLOT = [0, 1, -1, 2, 0, 2, -1, 1, 1, 0, 2]
ADAPTERS = {0: (4, 0.5, (0, 1)), 1: (8, 2.0, (0,)), 2: (2, 1.0, (0, 1))}


def _payload() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)
    adapters = {
        slot: {k: (torch.randn(r, HIDDEN, generator=gen) / 4, torch.randn(INTER, r, generator=gen),
                   scale) for k in slices}
        for slot, (r, scale, slices) in ADAPTERS.items()}
    return {"hidden": HIDDEN, "inter": INTER, "row_slot": ROW_SLOT, "adapters": adapters,
            "x": torch.randn(len(ROW_SLOT), HIDDEN, generator=gen),
            "w_gu": torch.randn(2 * INTER, HIDDEN, generator=gen) / 4,
            "num_slots": 3, "max_rank": 8}


PAYLOAD = _payload()


def reference(p: dict[str, Any]) -> torch.Tensor:
    x = p["x"].double()
    y = x @ p["w_gu"].double().T
    for t, slot in enumerate(p["row_slot"]):
        for k, (a, b, scale) in (p["adapters"][slot].items() if slot >= 0 else ()):
            y[t, k * INTER:(k + 1) * INTER] += scale * (x[t] @ a.double().T) @ b.double().T
    return F.silu(y[:, :INTER]) * y[:, INTER:]


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_gate_up:run", PAYLOAD, timeout_s=240.0)


@pytest.mark.parametrize("layout", [LAYOUT_LOCAL, LAYOUT_PAPER])
def test_gate_up_shards_match_global_activation(ranks: list[dict[str, Any]],
                                                layout: str) -> None:
    got = torch.cat([ranks[j][layout]["act"] for j in range(2)], dim=1)  # output-sharded
    torch.testing.assert_close(got.double(), reference(PAYLOAD), rtol=1e-5, atol=1e-5)


def test_default_layout_folds_without_collective(ranks: list[dict[str, Any]]) -> None:
    for j in range(2):
        assert ranks[j][LAYOUT_LOCAL]["folded"] == [True]
        assert ranks[j][LAYOUT_LOCAL]["lora_calls"] == 0
        assert ranks[j][LAYOUT_PAPER]["folded"] == []  # the paper layout never asks
        assert ranks[j][LAYOUT_PAPER]["lora_calls"] == 1
