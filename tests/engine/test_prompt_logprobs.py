"""Prompt logprobs (for OpenAI's echo): every prompt token after the first scored by the
model after the tokens before it, equal to HF transformers + PEFT log-softmax (fp32) for
base and adapter requests in one batch with chunked prefill and preemption; requests that
do not ask get no extra logit rows, and a scoring request never reads the prefix cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.batch_plan import build_batch_plan
from dataplane.core import SamplingParams, Sequence
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.engine import RequestOutput

from .helpers import adapter_pages, hf_logits

TOL = dict(atol=5e-5, rtol=1e-4)
PROMPTS = {
    "p_base": ([5, 17, 33, 9, 100, 7, 250, 3, 64, 128, 12, 99, 4, 8, 15, 16, 23], None, 3),
    "p_all": ([9, 9, 9, 31, 200, 60, 61, 62, 63], "all_r8", 0),
    "p_attn": ([42, 3, 141, 59, 26, 53, 58, 97, 93, 23, 84, 62, 64], "attn_r4", 5),
}


def test_prompt_logprobs_equal_hf_peft(tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    check_prompt_logprobs(tiny_llama, tiny_adapters, "cpu")


@pytest.mark.gpu
def test_prompt_logprobs_equal_hf_peft_on_cuda(cuda_device: torch.device, tiny_llama: Path,
                                               tiny_adapters: dict[str, Path]) -> None:
    """On CUDA the mixed steps run through the piecewise graphs (their logit rows)."""
    check_prompt_logprobs(tiny_llama, tiny_adapters, "cuda")


def check_prompt_logprobs(tiny_llama: Path, tiny_adapters: dict[str, Path], device: str
                          ) -> None:
    engine = build_engine(EngineSpec.of(
        tiny_llama, dtype="float32", device=device, max_num_seqs=5, max_num_batched_tokens=8,
        num_kv_blocks=12 + adapter_pages(tiny_llama, tiny_adapters, 4), block_size=4,
        max_slots=3, max_rank=8))
    handles = {n: engine.register_adapter(p) for n, p in tiny_adapters.items()}
    for rid, (prompt, adapter, k) in PROMPTS.items():
        engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=6,
                                                       ignore_eos=True, prompt_logprobs=k),
                           handles[adapter] if adapter else None)
    engine.add_request("plain", [1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(max_tokens=8))
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.num_preemptions > 0, "the KV pool was meant to force preemption"
    assert done["plain"].prompt_logprobs is None
    for rid, (prompt, adapter, k) in PROMPTS.items():
        out = done[rid]
        assert out.num_cached_tokens == 0
        assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt) - 1
        ref = hf_logits(tiny_llama, prompt, tiny_adapters[adapter] if adapter else None
                        ).log_softmax(-1)
        for j, lp in enumerate(out.prompt_logprobs):  # entry j scores token j + 1
            assert lp.token_id == prompt[j + 1]
            ids = torch.tensor([lp.token_id] + [t for t, _ in lp.top])
            got = torch.tensor([lp.logprob] + [v for _, v in lp.top])
            torch.testing.assert_close(got, ref[j][ids], **TOL)
            assert [t for t, _ in lp.top] == ref[j].topk(k).indices.tolist()


def test_a_scoring_request_skips_the_prefix_cache(tiny_llama: Path) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, dtype="float32", device="cpu",
                                        num_kv_blocks=64, block_size=4))
    prompt = list(range(10, 30))
    engine.generate([prompt], SamplingParams(max_tokens=2))
    again, scored = engine.generate(
        [prompt, prompt], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=2,
                                                                        prompt_logprobs=0)])
    assert again.num_cached_tokens == 16 and scored.num_cached_tokens == 0
    assert scored.prompt_logprobs is not None and len(scored.prompt_logprobs) == 19


def test_plan_scores_only_the_asking_requests_prompt_rows() -> None:
    asking = Sequence("a", tuple(range(3, 13)), SamplingParams(prompt_logprobs=1))
    other = Sequence("b", (1, 2, 3, 4), SamplingParams())
    for seq, blocks in ((asking, [0, 1, 2]), (other, [3])):
        seq.block_table.extend(blocks)
    asking.num_computed_tokens = 4  # a chunk over positions 4..7 of 10: rows 0..3 score
    plan = build_batch_plan([(other, 4), (asking, 4)], [], block_size=4, generation=1)
    rows = [plan.positions[r] for r in plan.prompt_logprob_rows]
    assert rows == [4, 5, 6, 7] and plan.sample_rows == (3,)
    assert plan.logit_rows == (3, *plan.prompt_logprob_rows)
    last = build_batch_plan([(asking, 6)], [], block_size=4, generation=2)
    assert [last.positions[r] for r in last.prompt_logprob_rows] == [4, 5, 6, 7, 8]
