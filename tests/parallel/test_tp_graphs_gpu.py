"""Two GPUs, NCCL: each rank's captured decode graph (collectives inside) replays the eager
TP step. Skipped without two CUDA devices (`scripts/gpu_run.sh tptests` on a 2-GPU host)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .dist_harness import run_world
from .scenarios_graphs import DECODE_STEPS, check_folded_steps

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]


@pytest.fixture(scope="module", params=["launch", "fold"])
def ranks(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_graphs:run", {"case": request.param},
                     timeout_s=300.0, device="cuda")


def test_replayed_tp_graph_equals_eager_step(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["replays"] == DECODE_STEPS
        for step in rank["steps"]:
            # padded batch (8 rows vs 5) may pick other GEMM tiles: close, same argmax
            torch.testing.assert_close(step["graphed"], step["eager"], rtol=1e-3, atol=1e-3)
            assert torch.equal(step["graphed"].argmax(-1), step["eager"].argmax(-1))
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        torch.testing.assert_close(a["graphed"], b["graphed"], rtol=0, atol=0)


def test_replay_counts_the_captured_collectives(ranks: list[dict[str, Any]]) -> None:
    layers = ranks[0]["num_layers"]
    for rank in ranks:
        for step in rank["steps"]:
            g, e = step["graph_ledger"], step["eager_ledger"]
            assert g["base_calls"] == e["base_calls"] == 2 * layers + 2
            assert g["lora_calls"] == e["lora_calls"] == 0


def test_folded_lora_step_equals_the_launch_path(ranks: list[dict[str, Any]]) -> None:
    """With the LoRA folded into the base GEMMs and their consumer ops (graphed and eager),
    each decode step's logits equal the same step through the LoRA launches."""
    check_folded_steps(ranks, 1e-3)
