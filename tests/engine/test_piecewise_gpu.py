"""GPU (marked `gpu`): mixed steps replayed as piecewise CUDA graphs
(`enable_piecewise_graphs`) give HF + PEFT's greedy tokens and fp32 logprobs. A small token
budget chunks the prompts, so most steps mix prefill chunks with decode rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine

from .helpers import HFReference
from .test_gpu import MAX_TOKENS, REQUESTS

pytestmark = pytest.mark.gpu


def test_piecewise_graphs_match_hf(cuda_device: torch.device, tiny_llama: Path,
                                   tiny_adapters: dict[str, Path]) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, dtype="float32", device="cuda", max_num_seqs=4,
                                   max_num_batched_tokens=12, num_kv_blocks=64, block_size=4,
                                   max_slots=4, max_rank=8, enable_cuda_graphs=True,
                                   enable_piecewise_graphs=True))
    pieces = engine.runner.piecewise
    assert pieces is not None and pieces.captured  # type: ignore[attr-defined]
    handles = {n: engine.register_adapter(p) for n, p in tiny_adapters.items()}
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outs = engine.generate([p for p, _ in REQUESTS], params,
                           [handles[a] if a else None for _, a in REQUESTS])
    assert pieces.runs > 0  # type: ignore[attr-defined]
    hf = HFReference(tiny_llama, tiny_adapters)
    for (prompt, name), out in zip(REQUESTS, outs, strict=True):
        ref_tokens, ref_logits = hf.greedy(prompt, MAX_TOKENS, name)
        assert list(out.token_ids) == ref_tokens, name
        got = torch.tensor([lp.logprob for lp in out.logprobs])
        want = ref_logits.log_softmax(-1)[torch.arange(MAX_TOKENS), torch.tensor(ref_tokens)]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
