"""Rank-side half of test_tp_piecewise*.py: a TP rank's mixed step, piecewise vs eager.

`run(group, payload)`: this rank's engine over its TP=2 shard of the tp_setup model with
its shard of both adapters in its pool. Requests 0-1 are prefilled eagerly; then every
mixed step (the other requests' prompts, in two chunks, next to decode rows of the first
ones) runs twice on the same plan: through the pieces (`PiecewiseGraphRunner` with the
rank's group: replayed on CUDA, the same pieces called eagerly on CPU) and through the
plain eager forward. Both write the
same K/V, so the second run sees the cache the first left. Returns both logits and each
path's collective ledger per step.
"""

from __future__ import annotations

from typing import Any

import torch

from dataplane.core import build_batch_plan
from dataplane.engine.piecewise_graphs import PiecewiseGraphRunner
from dataplane.parallel import TPGroup

from .scenarios_graphs import _ledger
from .tp_setup import BLOCK, close_channel, load_shards_directly, rank_engine, sequences

BUCKETS = (8, 16)
FIRST = 2  # requests prefilled before the mixed steps


def run(group: TPGroup, _payload: Any) -> dict[str, Any]:
    cuda = group.device.type == "cuda"
    engine = rank_engine(group)
    runner, config = engine.runner, engine.model.config
    load_shards_directly(engine, group)
    pieces = PiecewiseGraphRunner(runner, BUCKETS[-1], buckets=BUCKETS, run_eagerly=not cuda,
                                  group=group)
    if cuda:  # CUDA-only: capture (collective) on every rank, same buckets
        runner.warm_up_lora()
        pieces.capture_all()
    seqs = sequences(engine)
    first = runner.execute(build_batch_plan([(s, s.num_tokens) for s in seqs[:FIRST]], [],
                                            block_size=BLOCK, generation=0))
    for s, tok in zip(seqs[:FIRST], first.argmax(-1).tolist(), strict=True):
        s.num_computed_tokens = s.num_tokens
        s.token_ids.append(tok)
    steps = []
    waiting = seqs[FIRST:]
    for step in range(3):
        decoding = [s for s in seqs if s not in waiting]
        # prompts in chunks of at most 4 tokens next to the decode rows
        chunks = [(s, min(4, s.num_tokens - s.num_computed_tokens)) for s in waiting]
        plan = build_batch_plan(chunks, decoding, block_size=BLOCK, generation=step + 1)
        group.counter.reset()
        ran = pieces.run(plan, None)
        if ran is None:
            raise RuntimeError(f"mixed plan of {plan.num_rows} rows fit no bucket")
        ran = ran.clone()
        piece_ledger = _ledger(group)
        group.counter.reset()
        eager = runner.execute(plan)  # runner.piecewise is None: the eager path
        steps.append({"pieces": ran.cpu(), "eager": eager.cpu(), "rows": plan.num_rows,
                      "prefill_rows": plan.num_rows - len(decoding),
                      "piece_ledger": piece_ledger, "eager_ledger": _ledger(group)})
        by_id = dict(zip(plan.sample_request_ids, eager.argmax(-1).tolist(), strict=True))
        for s, n in chunks:
            s.num_computed_tokens += n
        for s in decoding:
            s.num_computed_tokens = s.num_tokens
        for s in seqs:
            if s.request_id in by_id and s.num_computed_tokens == s.num_tokens:
                s.token_ids.append(by_id[s.request_id])
        waiting = [s for s in waiting if s.request_id not in by_id]  # prompt not done
    close_channel(engine)
    return {"steps": steps, "runs": pieces.runs, "num_layers": config.num_layers,
            "captured": sorted(pieces.captured), "ledgers": sorted(pieces.ledgers)}


def check_steps(ranks: list[dict[str, Any]], tol: float) -> None:
    """Pieces vs eager: same logits within `tol` (padded rows may pick other GEMM tiles on
    CUDA), same argmax, the same gathered logits on both ranks; the same collective calls
    (base: o + down per layer, embedding, LM head; LoRA: none), and more base bytes (rows
    padded to the bucket)."""
    layers = ranks[0]["num_layers"]
    for rank in ranks:
        assert rank["runs"] == 3
        for step in rank["steps"]:
            torch.testing.assert_close(step["pieces"], step["eager"], rtol=tol, atol=tol)
            assert torch.equal(step["pieces"].argmax(-1), step["eager"].argmax(-1))
            p, e = step["piece_ledger"], step["eager_ledger"]
            assert p["base_calls"] == e["base_calls"] == 2 * layers + 2
            assert p["lora_calls"] == e["lora_calls"] == 0
            assert p["base_bytes"] > e["base_bytes"]
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        torch.testing.assert_close(a["pieces"], b["pieces"], rtol=0, atol=0)
