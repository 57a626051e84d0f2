"""Engine end to end against HF transformers + PEFT `generate`, each request run alone.

One mixed batch: base rows and three adapters (ranks 2/4/8 with rank/alpha patterns and
rsLoRA, different target sets), prompt lengths 1..21, requests arriving at different
steps, chunked prefill (token budget 16) and preemption (a KV pool too small for all of
them). Greedy tokens must equal HF's; each step's logprobs (log-softmax of the logits)
must match HF's within fp32 tolerance. Again with the LoRA folded into the base GEMMs and
their consumer ops (`lora_fold`: steps of at most 6 rows, the decode steps and the
smallest chunks).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.engine import EngineSpec, build_engine

from .helpers import HFReference, adapter_pages, serve_arrivals

# (prompt, adapter name or None, max_tokens, arrival step)
REQUESTS = [
    ([5, 17, 33, 9, 100, 7, 250, 3, 64, 128, 12, 99, 4, 8, 15, 16, 23, 42, 77, 1, 2], "all_r8",
     8, 0),
    ([1], None, 6, 0),
    ([9, 9, 9, 31, 200], "attn_r4", 10, 0),
    ([60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72], "mlp_rs2", 7, 1),
    ([3, 141, 59, 26, 53], None, 9, 1),
    ([200, 100, 50, 25, 12, 6, 3], "all_r8", 5, 3),
    ([7, 7, 1, 7, 7, 2, 7, 7, 3, 7, 7, 4, 7, 7, 5, 7, 7], "attn_r4", 8, 3),
    ([11, 22, 33], "mlp_rs2", 6, 6),
]
LOGPROB_TOL = dict(atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("lora_fold", [False, True])
def test_mixed_batch_matches_hf_peft_alone(tiny_llama: Path, tiny_adapters: dict[str, Path],
                                           lora_fold: bool) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, dtype="float32", device="cpu", max_num_seqs=6,
                                   max_num_batched_tokens=16,
                                   num_kv_blocks=14 + adapter_pages(tiny_llama, tiny_adapters, 4),
                                   block_size=4,
                                   max_slots=4, max_rank=8, lora_fold=lora_fold))
    handles = {name: engine.register_adapter(path) for name, path in tiny_adapters.items()}
    assert len({h.slot for h in handles.values()}) == 3
    outputs = serve_arrivals(engine, REQUESTS, handles, logprobs=20)
    assert engine.num_preemptions > 0, "the KV pool was meant to force preemption"
    folds = [linear.fold.uses for linear in engine.runner.linears.values()
             if linear.fold is not None]
    assert len(folds) == (len(engine.runner.linears) if lora_fold else 0)
    assert all(uses > 0 for uses in folds)  # every projection folded some steps
    hf = HFReference(tiny_llama, tiny_adapters)
    for i, (prompt, adapter, max_tokens, _arrival) in enumerate(REQUESTS):
        out = outputs[f"r{i}"]
        ref_tokens, ref_logits = hf.greedy(prompt, max_tokens, adapter)
        assert list(out.token_ids) == ref_tokens, f"request r{i} ({adapter})"
        if adapter is not None:  # the adapter visibly changes HF's logits: the test has teeth
            _, base_logits = hf.greedy(prompt, 1, None)
            assert (base_logits[0] - ref_logits[0]).abs().max() > 1e-2
        assert out.finish_reason == "length"
        assert out.logprobs is not None and len(out.logprobs) == max_tokens
        ref_lp = ref_logits.log_softmax(-1)
        for step_lp, ref_row in zip(out.logprobs, ref_lp, strict=True):
            ids = torch.tensor([step_lp.token_id] + [t for t, _ in step_lp.top])
            got = torch.tensor([step_lp.logprob] + [v for _, v in step_lp.top])
            torch.testing.assert_close(got, ref_row[ids], **LOGPROB_TOL)
            assert [t for t, _ in step_lp.top] == ref_row.topk(20).indices.tolist()
