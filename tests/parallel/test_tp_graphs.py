"""TP decode steps through the graph runner equal the eager TP step (two gloo ranks, CPU).

On CPU the captured computation runs without a graph (`run_padded`: static buffers,
padding rows, device-side attention and LoRA metadata), so this checks everything a
captured TP step computes — and the collectives it issues — except the capture itself;
tests/parallel/test_tp_graphs_gpu.py replays real graphs over NCCL.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
import torch

from dataplane.parallel.collectives import CollectiveCounter

from .dist_harness import run_world
from .scenarios_graphs import DECODE_STEPS, check_folded_steps


@pytest.fixture(scope="module", params=["launch", "fold"])
def ranks(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_graphs:run", {"case": request.param})


def test_padded_graph_step_equals_eager_step(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert len(rank["steps"]) == DECODE_STEPS
        for step in rank["steps"]:
            torch.testing.assert_close(step["graphed"], step["eager"], rtol=1e-5, atol=1e-5)
            assert torch.equal(step["graphed"].argmax(-1), step["eager"].argmax(-1))
    # all-gathered logits: both ranks hold the same values
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        torch.testing.assert_close(a["graphed"], b["graphed"], rtol=0, atol=0)


def test_lora_warm_up_covers_the_shard_shapes_without_collectives(
    ranks: list[dict[str, Any]],
) -> None:
    """`ModelRunner.warm_up_lora` launches every projection shape of the rank's shard at
    every warm-up row count (max_rows 64: 1, 2, 4, ..., 64), locally: no collective call
    or byte."""
    for rank in ranks:
        assert rank["shapes"] == 4  # q/k/v, o, gate/up, down at the local sizes
        assert rank["warm_calls"] == 7 * rank["shapes"]
        assert rank["warm_ledger"] == {"base_calls": 0, "lora_calls": 0, "base_bytes": 0,
                                       "lora_bytes": 0}


def test_graph_step_issues_the_eager_collectives(ranks: list[dict[str, Any]]) -> None:
    """Same calls (base: o + down per layer, embedding, LM head; LoRA: none); bytes scale
    with the padded batch (8 rows vs 5)."""
    layers = ranks[0]["num_layers"]
    for rank in ranks:
        for step in rank["steps"]:
            g, e = step["graph_ledger"], step["eager_ledger"]
            assert g["base_calls"] == e["base_calls"] == 2 * layers + 2
            assert g["lora_calls"] == e["lora_calls"] == 0
            assert g["base_bytes"] * 5 == e["base_bytes"] * 8


def test_counter_add_replays_a_captured_ledger() -> None:
    captured = CollectiveCounter()
    captured.record("base", "all_reduce", 100, Fraction(100))
    captured.record("lora", "all_gather", 8, Fraction(4))
    ledger = captured.tallies()
    captured.record("base", "all_reduce", 1, Fraction(1))  # the copy does not follow later records
    counter = CollectiveCounter()
    for _ in range(3):
        counter.add(ledger)
    assert (counter.calls("base"), counter.payload_bytes("base")) == (3, 300)
    assert (counter.calls("lora"), counter.ring_bytes("lora")) == (3, 12)


def test_folded_lora_step_equals_the_launch_path(ranks: list[dict[str, Any]]) -> None:
    """With the LoRA folded into the base GEMMs and their consumer ops (graphed and eager),
    each decode step's logits equal the same step through the LoRA launches."""
    check_folded_steps(ranks, 1e-5)
