"""Rank-side half of test_tp_graphs*.py: a TP rank's decode step, graphed vs eager.

`run(group, payload)`: this rank's engine over its TP=2 shard of the tp_setup model with
its shard of both adapters in its pool ("fold": decode steps fold the LoRA into the base
GEMMs, fold widths in steps of one slot, and each step also runs with the fold off,
"unfolded"). The requests are prefilled eagerly, then every decode step runs twice on the
same plan: through the decode graph runner (replayed on CUDA, `run_padded` on CPU) and
eagerly (`ModelRunner.execute` with no graphs). Both write the same K/V (same tokens,
same slots), so the second run sees the cache the first left. Returns, per step, both
logits (CPU) and the per-step collective ledger of each path.
"""

from __future__ import annotations

from typing import Any

import torch

from dataplane.core import build_batch_plan
from dataplane.engine.cuda_graphs import CudaGraphRunner
from dataplane.parallel import TPGroup

from .tp_setup import close_channel, load_shards_directly, rank_engine, sequences

DECODE_STEPS = 4
MAX_BATCH = 8
MAX_CONTEXT = 32


def _ledger(group: TPGroup) -> dict[str, int]:
    c = group.counter
    return {"base_calls": c.calls("base"), "lora_calls": c.calls("lora"),
            "base_bytes": c.payload_bytes("base"), "lora_bytes": c.payload_bytes("lora")}


def check_folded_steps(ranks: list[dict[str, Any]], tol: float) -> None:
    """test_tp_graphs*.py: in the "fold" case every decode step, graphed and eager, equals
    the same step through the LoRA launches (`tol`: rtol = atol); no other case folds."""
    folded = [step for rank in ranks for step in rank["steps"] if "unfolded" in step]
    assert len(folded) == (2 * DECODE_STEPS if ranks[0]["case"] == "fold" else 0)
    for step in folded:
        torch.testing.assert_close(step["eager"], step["unfolded"], rtol=tol, atol=tol)
        torch.testing.assert_close(step["graphed"], step["unfolded"], rtol=tol, atol=tol)
        assert torch.equal(step["eager"].argmax(-1), step["unfolded"].argmax(-1))


def run(group: TPGroup, payload: dict[str, Any]) -> dict[str, Any]:
    dev = group.device
    fold = payload["case"] == "fold"
    engine = rank_engine(group)
    runner, model = engine.runner, engine.model
    if fold:
        engine.pool.enable_fold(width_unit=1)  # graphs per fold width 1 and 2
    load_shards_directly(engine, group)
    # every projection's kernels warm up locally (no collective: the ledger stays empty)
    group.counter.reset()
    warm_calls = runner.warm_up_lora()
    warm_ledger = _ledger(group)
    shapes = {(w.in_features, tuple(w.out_features))
              for w in (lin.factors.weights for lin in runner.linears.values()
                        if lin.factors is not None)}
    graphs = CudaGraphRunner(runner, MAX_BATCH, MAX_CONTEXT, group=group)
    if dev.type == "cuda":  # CUDA-only: capture (collective) on every rank, same sizes
        graphs.capture_all()
    seqs = sequences(engine)
    first = runner.execute(build_batch_plan([(s, s.num_tokens) for s in seqs], [],
                                            block_size=runner.cache.block_size, generation=0))
    next_ids = first.argmax(-1).tolist()
    steps = []
    for step in range(DECODE_STEPS):
        for s, tok in zip(seqs, next_ids, strict=True):
            s.num_computed_tokens = s.num_tokens
            s.token_ids.append(tok)
        plan = build_batch_plan([], seqs, block_size=runner.cache.block_size,
                                generation=step + 1)
        group.counter.reset()
        if dev.type == "cuda":
            graphed = graphs.try_replay(plan)
            if graphed is None:
                raise RuntimeError("decode plan did not fit a captured graph")
        else:
            graphed = graphs.run_padded(plan)
        graphed = graphed.clone()
        graph_ledger = _ledger(group)
        group.counter.reset()
        eager = runner.execute(plan)  # runner.graphs is None: the eager path
        steps.append({"graphed": graphed.cpu(), "eager": eager.cpu(),
                      "graph_ledger": graph_ledger, "eager_ledger": _ledger(group)})
        if fold:  # the same step through the launch path
            rows, model.lora_fold_rows = model.lora_fold_rows, 0
            steps[-1]["unfolded"] = runner.execute(plan).cpu()
            model.lora_fold_rows = rows
        next_ids = eager.argmax(-1).tolist()
    close_channel(engine)
    return {"steps": steps, "replays": graphs.replays, "num_layers": model.config.num_layers,
            "case": payload["case"], "warm_calls": warm_calls, "warm_ledger": warm_ledger,
            "shapes": len(shapes)}
