"""TP mixed steps through the piecewise runner equal the eager TP step (two gloo ranks).

On CPU the pieces run as plain calls on the runner's static buffers (`run_eagerly`), so
this checks the layer split, the staging, the padding to row buckets and the collectives
the pieces issue on a TP rank — everything but the capture itself;
tests/parallel/test_tp_piecewise_gpu.py replays real pieces over NCCL.
"""

from __future__ import annotations

from typing import Any

import pytest

from .dist_harness import run_world
from .scenarios_piecewise import check_steps


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_piecewise:run", None)


def test_piecewise_mixed_steps_equal_eager_steps(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:  # 3 steps: 10 prompt rows + 2 decode, 3 + 4, then 5 decode rows
        assert [s["rows"] for s in rank["steps"]] == [12, 7, 5]
        assert [s["prefill_rows"] for s in rank["steps"]] == [10, 3, 0]
        assert all(s["pieces"].shape == s["eager"].shape for s in rank["steps"])
    check_steps(ranks, tol=1e-5)
