"""Two GPUs, NCCL: each rank's captured mixed-step pieces (collectives inside) replay the
eager TP step, and every replay counts the captured collectives. Skipped without two CUDA
devices (run on nvidia-h200-x2)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .dist_harness import run_world
from .scenarios_piecewise import BUCKETS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]


@pytest.fixture(scope="module", params=["default", "paper"])
def ranks(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_piecewise:run", {"layouts": request.param},
                     timeout_s=300.0, device="cuda")


def test_replayed_pieces_equal_eager_mixed_step(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["captured"] == rank["ledgers"] == list(BUCKETS)
        assert rank["runs"] == 3
        for step in rank["steps"]:
            # padded rows may pick other GEMM tiles: close, same argmax
            torch.testing.assert_close(step["pieces"], step["eager"], rtol=1e-3, atol=1e-3)
            assert torch.equal(step["pieces"].argmax(-1), step["eager"].argmax(-1))
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        torch.testing.assert_close(a["pieces"], b["pieces"], rtol=0, atol=0)


def test_replayed_pieces_count_the_captured_collectives(ranks: list[dict[str, Any]]) -> None:
    layers = ranks[0]["num_layers"]
    for rank in ranks:
        for step in rank["steps"]:
            p, e = step["piece_ledger"], step["eager_ledger"]
            assert p["base_calls"] == e["base_calls"] == 2 * layers + 2
            assert p["lora_calls"] == e["lora_calls"] in (0, 4 * layers)
            assert p["base_bytes"] > e["base_bytes"]
