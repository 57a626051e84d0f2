"""Two GPUs, NCCL: each rank's captured mixed-step pieces (collectives inside) replay the
eager TP step, and every replay counts the captured collectives. Skipped without two CUDA
devices (`scripts/gpu_run.sh tptests` on a 2-GPU host)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .dist_harness import run_world
from .scenarios_piecewise import BUCKETS, check_steps

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_piecewise:run", None,
                     timeout_s=300.0, device="cuda")


def test_replayed_pieces_equal_eager_mixed_steps(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["captured"] == rank["ledgers"] == list(BUCKETS)
    check_steps(ranks, tol=1e-3)
