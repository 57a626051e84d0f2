"""Rank-side half of test_publication.py: stage a shard, vote, publish or roll back."""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Any

import torch

from dataplane.parallel import TPGroup, publish_when_all_valid, validate_local_shard
from dataplane.parallel.publication import shard_digest
from dataplane.parallel.shard import shard_lora_factors


def run(group: TPGroup, p: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    for case in p["cases"]:
        local = shard_lora_factors(p["a"], p["b"], 1.0, style="row",
                                   tp_rank=group.rank, tp_size=group.size)
        # The manifest's expected digest, computed from the global artifact.
        expected = shard_digest([local.a, local.b])
        staged = [local.a.clone(), local.b.clone()]
        if group.rank in case.get("corrupt_ranks", ()):
            staged[1][0, 0] += 1  # a torn copy on this rank only
        ok, actual = validate_local_shard(staged, expected)
        events: list[str] = []
        generation = case.get("generation_by_rank", {}).get(group.rank, 7)
        identity = hashlib.sha256(f"layout of rank {group.rank}".encode()).hexdigest()
        outcome = publish_when_all_valid(
            group, generation=generation, contract_digest=p["contract"], local_ok=ok,
            local_shard_digest=actual, publish=partial(events.append, "publish"),
            rollback=partial(events.append, "rollback"), local_kernel_local=identity)
        results.append({"events": events, "published": outcome.published,
                        "reason": outcome.reason, "local_ok": ok,
                        "votes": [(v.rank, v.ok, v.generation, v.shard_digest)
                                  for v in outcome.votes],
                        "kernel_local": [v.kernel_local for v in outcome.votes],
                        "my_kernel_local": identity,
                        "my_digest": actual, "control_calls": group.counter.calls("control")})
        group.counter.reset()
    return results


def payload() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)
    return {"a": torch.randn(4, 8, generator=gen), "b": torch.randn(6, 4, generator=gen),
            "contract": "ab" * 32,
            "cases": [{}, {"corrupt_ranks": (1,)}, {"generation_by_rank": {0: 8}},
                      {"corrupt_ranks": (0, 1)}]}
