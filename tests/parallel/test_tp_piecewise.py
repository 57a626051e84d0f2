"""TP mixed steps through the piecewise runner equal the eager TP step (two gloo ranks).

On CPU the pieces run as plain calls on the runner's static buffers (`run_eagerly`), so
this checks the layer split, the staging, the padding to row buckets and the collectives
the pieces issue on a TP rank — everything but the capture itself;
tests/parallel/test_tp_piecewise_gpu.py replays real pieces over NCCL.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .dist_harness import run_world


@pytest.fixture(scope="module", params=["default", "paper"])
def ranks(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_piecewise:run", {"layouts": request.param})


def test_piecewise_mixed_step_equals_eager_step(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["runs"] == 3
        assert [s["rows"] for s in rank["steps"]] == [12, 7, 5]
        assert [s["prefill_rows"] for s in rank["steps"]] == [10, 3, 0]
        for step in rank["steps"]:
            assert step["pieces"].shape == step["eager"].shape
            torch.testing.assert_close(step["pieces"], step["eager"], rtol=1e-5, atol=1e-5)
            assert torch.equal(step["pieces"].argmax(-1), step["eager"].argmax(-1))
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):  # gathered logits
        torch.testing.assert_close(a["pieces"], b["pieces"], rtol=0, atol=0)


def test_pieces_issue_the_eager_collectives(ranks: list[dict[str, Any]]) -> None:
    """Same calls (base: o + down per layer, embedding, LM head; LoRA: none in the default
    layout, one per projection in the paper one); the base bytes but the LM head's scale
    with the padded bucket (16 rows for 12, 8 for 7 and 5)."""
    layers = ranks[0]["num_layers"]
    for rank in ranks:
        for step in rank["steps"]:
            p, e = step["piece_ledger"], step["eager_ledger"]
            assert p["base_calls"] == e["base_calls"] == 2 * layers + 2
            assert p["lora_calls"] == e["lora_calls"] in (0, 4 * layers)
            assert p["base_bytes"] > e["base_bytes"]
