"""Piecewise graphs of mixed steps (engine/piecewise_graphs.py) on CPU: the pieces run
eagerly on the runner's static buffers (`run_eagerly`), so the layer split, the staging,
the padding to row buckets and the attention between pieces are checked against the
plain eager engine: same tokens, same logprobs, sync and async scheduling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.engine import EngineConfig
from dataplane.engine.piecewise_graphs import PiecewiseGraphRunner, row_buckets

PROMPTS = [([5, 17, 33, 9, 100, 7, 8, 41, 3], "all_r8"), ([1, 2, 3], None),
           ([9, 9, 9, 31, 200, 4, 4], "attn_r4"), ([60, 61, 62, 63, 64], "mlp_rs2"),
           ([3, 141, 59, 26, 11, 12, 13, 14, 15, 16, 17], "all_r8")]


def test_row_buckets() -> None:
    assert row_buckets(1, 64) == (64,)
    assert row_buckets(1, 200, step=64) == (64, 128, 192, 200)
    assert row_buckets(65, 1600) == (128, 192, 256, 320, 384, 448, 512, 576, 640, 704, 768,
                                      832, 896, 960, 1024, 1280, 1536, 1600)
    with pytest.raises(ValueError):
        row_buckets(0, 10)


def _run(model_dir: Path, adapters: dict[str, Path], *, pieces: bool, async_on: bool,
         backend: str = "torch", max_tokens: int = 8, num_prompts: int = len(PROMPTS)
         ) -> tuple[dict[str, list[int]], dict[str, list[float]], int]:
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=64,
                          block_size=4, max_slots=3, max_rank=8, sampler_seed=5,
                          async_scheduling=async_on, lora_backend=backend,
                          attention_backend=backend,
                          ops_backend="triton" if backend == "triton" else None)
    engine = build_engine(EngineSpec.of(model_dir, dtype="float32", device="cpu",
                                   **config.__dict__))
    handles = {name: engine.register_adapter(path) for name, path in adapters.items()}
    runner = None
    if pieces:  # buckets of 8 and 16 rows: every step pads (max 16 batched tokens)
        runner = PiecewiseGraphRunner(engine.runner, 16, buckets=(8, 16), run_eagerly=True)
        engine.runner.piecewise = runner
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}
    for i, (prompt, adapter) in enumerate(PROMPTS[:num_prompts]):
        params = (SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=1,
                                 ignore_eos=True)
                  if i % 2 == 0 else
                  SamplingParams(temperature=0.9, top_p=0.9, seed=7 + i, max_tokens=max_tokens,
                                 logprobs=1, ignore_eos=True))
        engine.add_request(f"r{i}", prompt, params, handles[adapter] if adapter else None)
    step = 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = list(out.token_ids)
                logprobs[out.request_id] = [e.logprob for e in out.logprobs or ()]
        step += 1
        assert step < 200
    return tokens, logprobs, 0 if runner is None else runner.runs


@pytest.mark.parametrize("async_on", [False, True], ids=["sync", "async"])
def test_pieces_match_the_eager_engine(tiny_llama: Path, tiny_adapters: dict[str, Path],
                                       async_on: bool) -> None:
    want_tokens, want_lp, _ = _run(tiny_llama, tiny_adapters, pieces=False, async_on=async_on)
    got_tokens, got_lp, runs = _run(tiny_llama, tiny_adapters, pieces=True, async_on=async_on)
    assert runs > 0
    assert got_tokens == want_tokens
    for rid, want in want_lp.items():
        torch.testing.assert_close(torch.tensor(got_lp[rid]), torch.tensor(want),
                                   rtol=1e-4, atol=1e-4)


def test_pieces_on_the_triton_paths(tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    """The Triton LoRA backend (its per-step memo with every projection launched, as under
    capture), fused ops and attention kernels, interpreted on CPU."""
    kw = dict(async_on=False, backend="triton", max_tokens=3, num_prompts=3)
    want_tokens, want_lp, _ = _run(tiny_llama, tiny_adapters, pieces=False, **kw)
    got_tokens, got_lp, runs = _run(tiny_llama, tiny_adapters, pieces=True, **kw)
    assert runs > 0 and got_tokens == want_tokens
    for rid, want in want_lp.items():
        torch.testing.assert_close(torch.tensor(got_lp[rid]), torch.tensor(want),
                                   rtol=1e-4, atol=1e-4)
