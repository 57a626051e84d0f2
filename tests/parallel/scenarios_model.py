"""Rank-side half of test_llama_tp.py: greedy decoding, TP=1 model vs TP=2 / TP=4 shards
(at TP=4 the config's two kv heads are each replicated on two ranks)."""

from __future__ import annotations

from typing import Any

import torch

from dataplane.core import Sequence, build_batch_plan
from dataplane.engine.model_runner import ModelRunner
from dataplane.kernels import LoraFactorTable
from dataplane.models import ModelConfig, init_random
from dataplane.models.llama import LORA_GROUPS, LlamaForCausalLM
from dataplane.parallel import LAYOUT_LOCAL, LAYOUT_PAPER, TPGroup
from dataplane.parallel.llama_tp import TPLlamaForCausalLM

BLOCK = 4
MAX_RANK = 8
CONFIG = {"model_type": "llama", "vocab_size": 96, "hidden_size": 32,
          "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1,
          "eos_token_id": 2}
LAYOUT_SETS = {"default": {},
               "mixed": {"qkv_proj": LAYOUT_PAPER, "down_proj": LAYOUT_PAPER,
                         "o_proj": LAYOUT_LOCAL, "gate_up_proj": LAYOUT_LOCAL},
               "paper": dict.fromkeys(LORA_GROUPS, LAYOUT_PAPER)}
# (prompt, slot): slot -1 = base; slot 1's adapter skips the MLP
REQUESTS = [([5, 17, 33, 8, 61], -1), ([5, 17, 33, 8, 61], 0), ([70, 3, 44], 1),
            ([9, 9, 12, 80, 2, 40, 7], 0), ([70, 3, 44], -1)]
NEW_TOKENS = 6
FOLD_ROWS = 8  # the fold serves the 5-row decode steps, not the 27-row prefill


def adapters(config: ModelConfig) -> dict[int, dict[tuple[int, str], Any]]:
    gen = torch.Generator().manual_seed(11)
    shapes = {"qkv_proj": (config.hidden_size, (config.q_size, config.kv_size,
                                                config.kv_size)),
              "o_proj": (config.q_size, (config.hidden_size,)),
              "gate_up_proj": (config.hidden_size, (config.intermediate_size,) * 2),
              "down_proj": (config.intermediate_size, (config.hidden_size,))}
    out: dict[int, dict[tuple[int, str], Any]] = {}
    for slot, rank, attrs in ((0, 8, tuple(LORA_GROUPS)), (1, 4, ("qkv_proj", "o_proj"))):
        per = {}
        for layer in range(config.num_layers):
            for attr in attrs:
                d_in, widths = shapes[attr]
                per[(layer, attr)] = {
                    k: (0.3 * torch.randn(rank, d_in, generator=gen),
                        0.3 * torch.randn(w, rank, generator=gen), 2.0 / rank)
                    for k, w in enumerate(widths)}
        out[slot] = per
    return out


def greedy(runner: ModelRunner) -> tuple[list[list[int]], list[torch.Tensor]]:
    """All requests in one continuous batch: one prefill step, then decode steps."""
    seqs = []
    for i, (prompt, slot) in enumerate(REQUESTS):
        seq = Sequence(f"r{i}", tuple(prompt), adapter_slot=slot,
                       adapter_digest=None if slot < 0 else "0" * 64)
        blocks = -(-(len(prompt) + NEW_TOKENS) // BLOCK)
        seq.block_table.extend(range(i * 8, i * 8 + blocks))
        seqs.append(seq)
    logits_seen = []
    for step in range(NEW_TOKENS):
        if step == 0:
            plan = build_batch_plan([(s, s.num_tokens) for s in seqs], [], block_size=BLOCK,
                                    generation=step)
        else:
            plan = build_batch_plan([], seqs, block_size=BLOCK, generation=step)
        logits = runner.execute(plan)
        logits_seen.append(logits.clone())
        by_id = dict(zip(plan.sample_request_ids, logits.argmax(-1).tolist(), strict=True))
        for s in seqs:
            s.num_computed_tokens = s.num_tokens
            s.token_ids.append(by_id[s.request_id])
    return [s.output_token_ids for s in seqs], logits_seen


def runner_for(model: LlamaForCausalLM) -> ModelRunner:
    return ModelRunner(model, num_kv_blocks=64, block_size=BLOCK, max_rows=64, max_slots=2,
                       max_rank=MAX_RANK, attention_backend="torch")


def run(group: TPGroup, _payload: Any) -> dict[str, Any]:
    config = ModelConfig.from_dict(dict(CONFIG))
    model = init_random(LlamaForCausalLM(config, torch.float32, torch.device("cpu")), seed=5)
    factors = adapters(config)
    reference = runner_for(model)  # single-device, factors in stacked tables of its own
    tables = {key: LoraFactorTable(2, linear.in_features, linear.out_features, MAX_RANK,
                                   torch.float32, "cpu")
              for key, linear in reference.linears.items()}
    for key, table in tables.items():
        reference.linears[key].attach_factors(table)
    for slot, per in factors.items():
        for key, slices in per.items():
            tables[key].set_slot(slot, slices)
            reference.linears[key].set_adapted(True)
    ref_tokens, ref_logits = greedy(reference)
    out: dict[str, Any] = {"tp1_tokens": ref_tokens, "tp1_logits": ref_logits}
    for name, layouts in LAYOUT_SETS.items():
        tp = TPLlamaForCausalLM(model, group, lora_layouts=layouts, max_slots=2,
                                max_rank=MAX_RANK)
        runner = runner_for(tp)
        for slot, per in factors.items():
            tp.load_adapter(slot, per)
        group.counter.reset()
        tokens, logits = greedy(runner)
        out[name] = {"tokens": tokens, "logits": logits,
                     "base_calls": group.counter.calls("base"),
                     "lora_calls": group.counter.calls("lora"),
                     "kv_heads_local": tp.config.num_kv_heads,
                     "k_weight": tp.parallel_linear(0, "qkv_proj").weight[
                         config.q_size // group.size:][:tp.config.kv_size].clone()}
    out["fold"] = run_fold(model, group, factors)
    return out


def run_fold(model: LlamaForCausalLM, group: TPGroup,
             factors: dict[int, dict[tuple[int, str], Any]]) -> dict[str, Any]:
    """Default layout with every slot folded into the base GEMMs for decode steps: slot 0
    loaded before the fold is enabled, slot 1 after (both write paths)."""
    tp = TPLlamaForCausalLM(model, group, max_slots=2, max_rank=MAX_RANK)
    runner = runner_for(tp)
    tp.load_adapter(0, factors[0])
    tp.enable_lora_fold(FOLD_ROWS)
    tp.load_adapter(1, factors[1])
    group.counter.reset()
    tokens, logits = greedy(runner)
    stores = [tp.parallel_linear(i, attr).fold for i in range(len(tp.layers))
              for attr in LORA_GROUPS]
    return {"tokens": tokens, "logits": logits, "base_calls": group.counter.calls("base"),
            "lora_calls": group.counter.calls("lora"),
            "fold_uses": [s.uses if s is not None else None for s in stores]}
