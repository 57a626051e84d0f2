"""TP=2 and TP=4 (gloo ranks) give the same greedy tokens as the TP=1 model, base and
adapters.

The TP=1 reference is the single-device `LlamaForCausalLM` + `ModelRunner` with its own
LoRA tables (no dataplane.parallel code); TP shards the same weights and adapters with
the default layout, a per-module mix of both layouts, and the paper layout everywhere.
At TP=4 the model's two kv heads are fewer than the ranks: each is replicated on two.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .dist_harness import run_world
from .scenarios_model import LAYOUT_SETS, NEW_TOKENS, REQUESTS

LAYERS = 2


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def ranks(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_model:run", None, world_size=request.param,
                     timeout_s=240.0)


@pytest.mark.parametrize("layouts", list(LAYOUT_SETS))
def test_tp_greedy_tokens_equal_tp1(ranks: list[dict[str, Any]], layouts: str) -> None:
    ref = ranks[0]["tp1_tokens"]
    assert all(len(t) == NEW_TOKENS for t in ref)
    for j in range(len(ranks)):
        assert ranks[j][layouts]["tokens"] == ref
        for got, want in zip(ranks[j][layouts]["logits"], ranks[0]["tp1_logits"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_adapters_change_the_tokens(ranks: list[dict[str, Any]]) -> None:
    """Requests 0 and 1 share a prompt (base vs adapter 0), 2 and 4 too (adapter 1 vs
    base): the parity above is not vacuous."""
    ref = ranks[0]["tp1_tokens"]
    assert REQUESTS[0][0] == REQUESTS[1][0] and ref[0] != ref[1]
    assert REQUESTS[2][0] == REQUESTS[4][0] and ref[2] != ref[4]


def test_collectives_per_step(ranks: list[dict[str, Any]]) -> None:
    base_per_step = 2 * LAYERS + 2  # o + down per layer, embedding, LM head
    for j in range(len(ranks)):
        assert ranks[j]["default"]["base_calls"] == NEW_TOKENS * base_per_step
        assert ranks[j]["default"]["lora_calls"] == 0
        assert ranks[j]["mixed"]["lora_calls"] == NEW_TOKENS * 2 * LAYERS
        assert ranks[j]["paper"]["lora_calls"] == NEW_TOKENS * 4 * LAYERS


def test_folded_lora_equals_tp1(ranks: list[dict[str, Any]]) -> None:
    """Every slot folded into the base GEMMs and their consumer ops (decode steps; the
    prefill step takes the launch path): same greedy tokens and logits as TP=1, no LoRA
    collective, the base all-reduces unchanged in number, and every projection folded on
    every decode step."""
    for j in range(len(ranks)):
        fold = ranks[j]["fold"]
        assert fold["tokens"] == ranks[0]["tp1_tokens"]
        for got, want in zip(fold["logits"], ranks[0]["tp1_logits"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert fold["lora_calls"] == 0
        assert fold["base_calls"] == NEW_TOKENS * (2 * LAYERS + 2)
        assert fold["fold_uses"] == [NEW_TOKENS - 1] * (4 * LAYERS)


def test_kv_heads_split_or_replicate(ranks: list[dict[str, Any]]) -> None:
    """Two kv heads: one per rank at TP=2; at TP=4 ranks 0-1 hold head 0 and ranks 2-3
    head 1, the same k rows on both ranks of a pair and different across pairs."""
    size = len(ranks)
    k = [ranks[j]["default"]["k_weight"] for j in range(size)]
    assert all(ranks[j]["default"]["kv_heads_local"] == 1 for j in range(size))
    if size == 4:
        assert torch.equal(k[0], k[1]) and torch.equal(k[2], k[3])
        assert not torch.equal(k[0], k[2])
    else:
        assert not torch.equal(k[0], k[1])
