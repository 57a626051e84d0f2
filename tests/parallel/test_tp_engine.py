"""TP=2 and TP=4 (gloo ranks) serve the same greedy tokens as one device, base and adapters.

The reference is the one-device `Engine` over the whole model; the TP ranks run the same
`Engine` class over their shards, in lockstep, each holding its shard of every adapter in
its own unified pool. At TP=4 the model's two kv heads are fewer than the ranks: each is
replicated on two. With and without the LoRA fold (decode steps fold it into the base
GEMMs, from the pool's pages, on every rank).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .dist_harness import run_world
from .tp_setup import CONFIG, NEW_TOKENS, REQUESTS

LAYERS = CONFIG["num_hidden_layers"]


@pytest.fixture(scope="module", params=[(2, False), (4, False), (2, True)],
                ids=["tp2", "tp4", "tp2-fold"])
def ranks(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    size, fold = request.param
    return run_world("tests.parallel.scenarios_engine:run", {"fold": fold}, world_size=size,
                     timeout_s=240.0)


def _close(got: list[list[float]], want: list[list[float]]) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-4, atol=1e-4)


def test_tp_greedy_tokens_equal_one_device(ranks: list[dict[str, Any]]) -> None:
    leader = ranks[0]
    ref = leader["reference"]
    assert all(len(t) == NEW_TOKENS for t in ref["tokens"])
    for run in ("tp", "again"):  # before and after adapter 1 was unloaded and reloaded
        assert leader[run]["tokens"] == ref["tokens"]
        _close(leader[run]["logprobs"], ref["logprobs"])


def test_adapters_change_the_tokens(ranks: list[dict[str, Any]]) -> None:
    """Requests 0 and 1 share a prompt (base vs adapter 0), 2 and 4 too (adapter 1 vs
    base): the parity above is not vacuous."""
    ref = ranks[0]["reference"]["tokens"]
    assert REQUESTS[0][0] == REQUESTS[1][0] and ref[0] != ref[1]
    assert REQUESTS[2][0] == REQUESTS[4][0] and ref[2] != ref[4]


def test_lora_adds_no_collective(ranks: list[dict[str, Any]]) -> None:
    """Per forward: o + down per layer, the embedding and the LM head; one prefill step
    then NEW_TOKENS - 1 decode steps (the prompts fit one step)."""
    leader = ranks[0]
    assert leader["lora_calls"] == 0
    assert leader["base_calls"] == NEW_TOKENS * (2 * LAYERS + 2)


def test_followers_ran_the_plans_on_their_shards(ranks: list[dict[str, Any]]) -> None:
    """Both adapters took slots 0 and 1 again after the reload; the followers ran the
    leader's plans and hold factor pages."""
    assert ranks[0]["slots"] == [0, 1]
    for follower in ranks[1:]:
        assert follower["plans"] >= 2 * NEW_TOKENS
        assert sum(follower["pages_written"]) > 0


def test_the_fold_runs_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    assert len({rank["folds"] for rank in ranks}) == 1


def test_kv_heads_split_or_replicate(ranks: list[dict[str, Any]]) -> None:
    """Two kv heads: one per rank at TP=2; at TP=4 ranks 0-1 hold head 0 and ranks 2-3
    head 1, the same k rows on both ranks of a pair and different across pairs."""
    size = len(ranks)
    k = [rank["k_weight"] for rank in ranks]
    assert all(rank["kv_heads_local"] == 1 for rank in ranks)
    if size == 4:
        assert torch.equal(k[0], k[1]) and torch.equal(k[2], k[3])
        assert not torch.equal(k[0], k[2])
    else:
        assert not torch.equal(k[0], k[1])
