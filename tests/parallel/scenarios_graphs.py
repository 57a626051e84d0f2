"""Rank-side half of test_tp_graphs*.py: a TP rank's decode step, graphed vs eager.

`run(group, payload)`: the TP=2 shard of the scenarios_model tiny Llama with two adapters
(default layout, or the paper layout with payload["layouts"] == "paper"; "fold": default
layout with both slots folded into the base GEMMs for decode steps, and each step run a
third time eagerly with the fold off, "unfolded"); requests are
prefilled eagerly, then every decode step runs twice on the same plan: through the graph
runner (`TPCudaGraphRunner`: replayed on CUDA, `run_padded` on CPU) and eagerly
(`ModelRunner.execute` with no graphs). Both write the same K/V (same tokens, same slots),
so the second run sees the cache the first left. Returns, per step, both logits (CPU) and
the per-step collective ledger of each path.
"""

from __future__ import annotations

from typing import Any

import torch

from dataplane.core import Sequence, build_batch_plan
from dataplane.engine.model_runner import ModelRunner
from dataplane.models import ModelConfig, init_random
from dataplane.models.llama import LlamaForCausalLM
from dataplane.parallel import TPGroup
from dataplane.parallel.llama_tp import TPLlamaForCausalLM
from dataplane.parallel.tp_graphs import TPCudaGraphRunner, attach_tp_graphs

from .scenarios_model import BLOCK, CONFIG, LAYOUT_SETS, MAX_RANK, REQUESTS, adapters

DECODE_STEPS = 4
MAX_BATCH = 8
MAX_CONTEXT = 32


def _ledger(group: TPGroup) -> dict[str, int]:
    c = group.counter
    return {"base_calls": c.calls("base"), "lora_calls": c.calls("lora"),
            "base_bytes": c.payload_bytes("base"), "lora_bytes": c.payload_bytes("lora")}


def sequences() -> list[Sequence]:
    """The scenarios_model requests, 8 KV blocks each (request i: blocks 8i..8i+7)."""
    seqs = []
    for i, (prompt, slot) in enumerate(REQUESTS):
        seq = Sequence(f"r{i}", tuple(prompt), adapter_slot=slot,
                       adapter_digest=None if slot < 0 else "0" * 64)
        seq.block_table.extend(range(i * 8, i * 8 + 8))
        seqs.append(seq)
    return seqs


def check_folded_steps(ranks: list[dict[str, Any]], tol: float) -> None:
    """test_tp_graphs*.py: in the "fold" case every decode step, graphed and eager, equals
    the same step through the LoRA launches (`tol`: rtol = atol); no other case folds."""
    folded = [step for rank in ranks for step in rank["steps"] if "unfolded" in step]
    assert len(folded) == (2 * DECODE_STEPS if ranks[0]["layouts"] == "fold" else 0)
    for step in folded:
        torch.testing.assert_close(step["eager"], step["unfolded"], rtol=tol, atol=tol)
        torch.testing.assert_close(step["graphed"], step["unfolded"], rtol=tol, atol=tol)
        assert torch.equal(step["eager"].argmax(-1), step["unfolded"].argmax(-1))


def tp_runner(group: TPGroup, layouts: str
              ) -> tuple[ModelConfig, TPLlamaForCausalLM, ModelRunner]:
    """This rank's TP=2 shard of the scenarios_model tiny Llama (layout set `layouts`)
    with its two adapters loaded, and a runner over it (Triton attention on CUDA)."""
    dev = group.device
    config = ModelConfig.from_dict(dict(CONFIG))
    model = init_random(LlamaForCausalLM(config, torch.float32, torch.device("cpu")), seed=5)
    tp = TPLlamaForCausalLM(model, group, lora_layouts=LAYOUT_SETS[layouts],
                            max_slots=2, max_rank=MAX_RANK)
    attention = "triton" if dev.type == "cuda" else "torch"
    runner = ModelRunner(tp, num_kv_blocks=64, block_size=BLOCK, max_rows=64, max_slots=2,
                         max_rank=MAX_RANK, attention_backend=attention)
    for slot, per in adapters(config).items():
        tp.load_adapter(slot, {k: {i: (a.to(dev), b.to(dev), s) for i, (a, b, s) in v.items()}
                               for k, v in per.items()})
    return config, tp, runner


def run(group: TPGroup, payload: dict[str, Any]) -> dict[str, Any]:
    dev = group.device
    fold = payload["layouts"] == "fold"
    config, tp, runner = tp_runner(group, "default" if fold else payload["layouts"])
    if fold:
        tp.enable_lora_fold(MAX_BATCH, width_unit=1)  # graphs per fold width 1 and 2
    # every sharded branch warms up locally (no collective: the ledger stays empty)
    group.counter.reset()
    warm_calls = runner.warm_up_lora()
    warm_ledger = _ledger(group)
    branch_shapes = {(lin.branch.layout, lin.branch.style, lin.branch.table.weights.in_features,
                      tuple(lin.branch.table.weights.out_features))
                     for _, _, lin in tp.lora_linears() if lin.branch is not None}
    graphs: TPCudaGraphRunner
    if dev.type == "cuda":  # CUDA-only: capture (collective) on every rank, same sizes
        graphs = attach_tp_graphs(runner, group, MAX_BATCH, MAX_CONTEXT)
        runner.graphs = None
    else:
        graphs = TPCudaGraphRunner(runner, group, MAX_BATCH, MAX_CONTEXT)
    seqs = sequences()
    first = runner.execute(build_batch_plan([(s, s.num_tokens) for s in seqs], [],
                                            block_size=BLOCK, generation=0))
    next_ids = first.argmax(-1).tolist()
    steps = []
    for step in range(DECODE_STEPS):
        for s, tok in zip(seqs, next_ids, strict=True):
            s.num_computed_tokens = s.num_tokens
            s.token_ids.append(tok)
        plan = build_batch_plan([], seqs, block_size=BLOCK, generation=step + 1)
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
            tp.lora_fold_rows = 0
            steps[-1]["unfolded"] = runner.execute(plan).cpu()
            tp.lora_fold_rows = MAX_BATCH
        next_ids = eager.argmax(-1).tolist()
    return {"steps": steps, "replays": graphs.replays, "num_layers": config.num_layers,
            "layouts": payload["layouts"],
            "warm_calls": warm_calls, "warm_ledger": warm_ledger,
            "branch_shapes": len(branch_shapes)}
