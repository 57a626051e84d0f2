"""logit_bias, min_tokens and repetition / frequency / presence penalties through the engine,
against HF transformers + PEFT `generate` run alone per request.

HF's own logits processors are the reference for repetition penalty (RepetitionPenalty),
logit bias (SequenceBias with one-token sequences) and min_tokens (MinNewTokensLength);
frequency and presence penalties, which HF does not have, come from a float64 processor
written from their definition (helpers.FrequencyPresence). Processors run in the engine's
order (bias, min_tokens, penalties). One mixed batch with base and adapter rows, chunked prefill and
preemption, synchronous and with async scheduling (where a decode step's penalty counts
must read the previous step's token while it is still on the device).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dataplane.artifacts import read_base_abi
from dataplane.core import SamplingParams
from dataplane.engine.engine import Engine, EngineConfig, RequestOutput
from dataplane.models import load_model

from .helpers import HFReference, adapter_pages, hf_generate

EOS = 2  # the tiny Llama's eos_token_id


# (prompt, adapter, SamplingParams); greedy throughout, so the processors decide tokens
REQUESTS: list[tuple[list[int], str | None, SamplingParams]] = [
    ([5, 17, 33, 9, 100, 7, 250, 3, 64, 128], "all_r8",
     SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.8)),
    ([9, 9, 9, 31, 200], None,
     SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, frequency_penalty=1.5)),
    ([60, 61, 62, 63, 64, 65, 66], "attn_r4",
     SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, presence_penalty=2.0,
                    frequency_penalty=-0.5)),
    ([3, 141, 59, 26, 53], "mlp_rs2",
     SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                    logit_bias=((7, 6.0), (200, -100.0), (11, 2.5)))),
    # eos forced by a bias, held back until min_tokens: 5 tokens, then eos ends it
    ([200, 100, 50, 25, 12, 6, 3], "all_r8",
     SamplingParams(temperature=0, max_tokens=12, min_tokens=5, logit_bias=((EOS, 100.0),))),
    # a stop token forced the same way, min_tokens holds it back too
    ([11, 22, 33], None,
     SamplingParams(temperature=0, max_tokens=12, min_tokens=3, stop_token_ids=(40,),
                    logit_bias=((40, 100.0),), ignore_eos=True)),
    ([7, 7, 1, 7, 7, 2, 7, 7, 3], "attn_r4",
     SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, repetition_penalty=0.6,
                    frequency_penalty=0.7, presence_penalty=0.3)),
    ([42, 43], None, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)),
]


def _engine(model_dir: Path, adapters: dict[str, Path], async_on: bool,
            device: str = "cpu") -> tuple[Engine, Any]:
    config = EngineConfig(max_num_seqs=5, max_num_batched_tokens=16, block_size=4,
                          num_kv_blocks=16 + adapter_pages(model_dir, adapters, 4),
                          max_slots=3, max_rank=8, async_scheduling=async_on)
    abi = read_base_abi(model_dir)
    engine = Engine(load_model(model_dir, torch.float32, torch.device(device)), config,
                    abi.h_base, abi, None)
    return engine, {n: engine.register_adapter(p) for n, p in adapters.items()}


def _serve(engine: Engine, handles: Any) -> dict[str, RequestOutput]:
    outputs: dict[str, RequestOutput] = {}
    for step in range(400):
        if step < len(REQUESTS):  # one arrival per step: prefill and decode rows mix
            prompt, adapter, params = REQUESTS[step]
            engine.add_request(f"r{step}", prompt, params, handles[adapter] if adapter else None)
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        if len(outputs) == len(REQUESTS):
            return outputs
    raise AssertionError("requests did not finish")


@pytest.mark.parametrize("async_on", [False, True])
def test_sampling_controls_match_hf_processors(tiny_llama: Path, tiny_adapters: dict[str, Path],
                                               async_on: bool) -> None:
    check_controls(tiny_llama, tiny_adapters, async_on, "cpu")


@pytest.mark.gpu
def test_sampling_controls_match_hf_processors_on_cuda(
        cuda_device: torch.device, tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    """The same on CUDA: async steps (the placeholder read on the device), decode graphs."""
    check_controls(tiny_llama, tiny_adapters, True, "cuda")


def check_controls(tiny_llama: Path, tiny_adapters: dict[str, Path], async_on: bool,
                   device: str) -> None:
    engine, handles = _engine(tiny_llama, tiny_adapters, async_on, device)
    outputs = _serve(engine, handles)
    assert engine.num_preemptions > 0, "the KV pool was meant to force preemption"
    if async_on:
        assert engine.num_overlapped_steps > 0
    hf = HFReference(tiny_llama, tiny_adapters)
    for i, (prompt, adapter, params) in enumerate(REQUESTS):
        got = list(outputs[f"r{i}"].token_ids)
        assert got == hf_generate(hf.model, prompt, adapter, params, EOS), f"r{i}"
        plain = hf.greedy(prompt, params.max_tokens, adapter)[0]
        if params.adjusts_logits:  # the control visibly changes the answer: the test has teeth
            assert got != plain, f"r{i} equals plain greedy"
    assert [outputs["r4"].finish_reason, len(outputs["r4"].token_ids)] == ["stop", 6]
    assert outputs["r4"].token_ids[-1] == EOS and EOS not in outputs["r4"].token_ids[:5]
    assert [outputs["r5"].finish_reason, outputs["r5"].token_ids[-1]] == ["stop", 40]
    assert len(outputs["r5"].token_ids) == 4


def test_logit_bias_beyond_the_vocab_is_refused(tiny_llama: Path,
                                                tiny_adapters: dict[str, Path]) -> None:
    from dataplane.core import InvalidSamplingParams

    engine, _ = _engine(tiny_llama, {}, False)
    with pytest.raises(InvalidSamplingParams, match="vocab size 256"):
        engine.add_request("r", [1, 2], SamplingParams(logit_bias=((256, 1.0),)))
    assert not engine.has_unfinished()
    engine.add_request("r", [1, 2], SamplingParams(logit_bias=((255, 1.0),), max_tokens=1))
