"""Every rank publishes a generation only when all ranks have validated it (two gloo ranks)."""

from __future__ import annotations

from typing import Any

import pytest

from .dist_harness import run_world
from .scenarios_publication import payload


@pytest.fixture(scope="module")
def ranks() -> list[list[dict[str, Any]]]:
    return run_world("tests.parallel.scenarios_publication:run", payload())


def test_all_valid_publishes_on_every_rank(ranks: list[list[dict[str, Any]]]) -> None:
    for j in range(2):
        r = ranks[j][0]
        assert r["published"] and r["events"] == ["publish"]
        assert r["control_calls"] == 1
    # each rank's vote carries its own shard digest; both ranks saw the same votes
    assert ranks[0][0]["votes"] == ranks[1][0]["votes"]
    assert [v[3] for v in ranks[0][0]["votes"]] == [ranks[0][0]["my_digest"],
                                                    ranks[1][0]["my_digest"]]
    assert ranks[0][0]["my_digest"] != ranks[1][0]["my_digest"]
    # and its own H_kernel_local (the rank's shard layout), in rank order on every rank
    mine = [ranks[j][0]["my_kernel_local"] for j in range(2)]
    assert ranks[0][0]["kernel_local"] == ranks[1][0]["kernel_local"] == mine
    assert mine[0] != mine[1]


def test_one_rank_failing_validation_blocks_every_rank(ranks: list[list[dict[str, Any]]]
                                                       ) -> None:
    assert ranks[0][1]["local_ok"] and not ranks[1][1]["local_ok"]
    for j in range(2):  # rank 0 validated its own shard and still does not publish
        r = ranks[j][1]
        assert not r["published"] and r["events"] == ["rollback"]
        assert r["reason"] == "ranks [1] failed shard validation"


def test_generation_disagreement_blocks_every_rank(ranks: list[list[dict[str, Any]]]) -> None:
    for j in range(2):
        r = ranks[j][2]
        assert r["local_ok"] and not r["published"] and r["events"] == ["rollback"]
        assert r["reason"] == "ranks disagree on the generation"


def test_all_failing_names_every_rank(ranks: list[list[dict[str, Any]]]) -> None:
    for j in range(2):
        assert ranks[j][3]["reason"] == "ranks [0, 1] failed shard validation"
