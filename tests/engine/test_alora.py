"""Activated LoRA through the engine, against PEFT's own aLoRA implementation.

The activation offset (last exact occurrence of the invocation tokens; the first
invocation token adapted), pre-activation rows as base rows in every adapted projection,
mixed batches with plain LoRA and base rows under chunked prefill and the LoRA fold, the
refusal of a prompt that never invokes the adapter, and the one base prefix the prefix
cache shares between a base request and the aLoRAs of the same base. References: HF
transformers + PEFT `generate` (which computes PEFT's aLoRA offsets itself), fp32, CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.assets import make_peft_adapter
from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.activation import AloraNotInvoked, activation_offset

from .conftest import ADAPTER_SPECS
from .helpers import HFReference, adapter_pages, serve_arrivals

INVOKE_A = [99, 100]
INVOKE_B = [7, 8, 9]
LOGPROB_TOL = dict(atol=5e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def alora_adapters(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> dict[str, Path]:
    """Two aLoRAs (different invocations, ranks and targets) beside two plain LoRAs."""
    root = tmp_path_factory.mktemp("alora")
    specs = {
        "alora_a": dict(seed=21, rank=8, alpha=16,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj"],
                        alora_invocation_tokens=INVOKE_A),
        "alora_b": dict(seed=22, rank=4, alpha=8, target_modules=["q_proj", "v_proj",
                                                                   "down_proj"],
                        alora_invocation_tokens=INVOKE_B),
        "attn_r4": ADAPTER_SPECS["attn_r4"],
        "mlp_rs2": ADAPTER_SPECS["mlp_rs2"],
    }
    return {name: make_peft_adapter(tiny_llama, root / name, **spec)  # type: ignore[arg-type]
            for name, spec in specs.items()}


def test_offset_is_the_start_of_the_last_occurrence() -> None:
    # the invocation [99, 100] in [11, 12, 99, 100]: rows 2 and 3 adapted
    assert activation_offset([11, 12, 99, 100], [99, 100]) == 2
    # two occurrences: the last one starts at 3
    assert activation_offset([99, 100, 11, 99, 100, 12], [99, 100]) == 3
    assert activation_offset([99, 100], [99, 100]) == 0
    assert activation_offset([99, 11, 100], [99, 100]) is None  # not contiguous
    assert activation_offset([100, 99], [99, 100]) is None
    assert activation_offset([5], [5, 6]) is None


# (prompt, adapter, max_tokens, arrival step): activation early, late, in the middle of a
# 16-token prefill chunk, twice in one prompt, and at position 0
REQUESTS = [
    ([5, 17, 33, 9, 100, 7, 250, 3, 64, 99, 100, 12, 99, 4, 8, 15, 16, 23, 42, 77, 1, 2],
     "alora_a", 8, 0),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 7, 8, 9], "alora_b",
     6, 0),
    ([9, 9, 9, 31, 200], "attn_r4", 7, 0),
    ([99, 100, 60, 61, 62, 63, 64, 65, 66, 99, 100, 67, 68, 69, 70], "alora_a", 7, 1),
    ([3, 141, 59, 26, 53], None, 6, 1),
    ([7, 8, 9, 11, 22, 33], "alora_b", 5, 2),
    ([60, 61, 62, 63, 64, 65, 66, 67], "mlp_rs2", 6, 3),
]


@pytest.mark.parametrize("lora_fold", [False, True])
def test_mixed_batch_matches_peft_alora(tiny_llama: Path, alora_adapters: dict[str, Path],
                                        lora_fold: bool) -> None:
    check_mixed_batch(tiny_llama, alora_adapters, "cpu", lora_fold=lora_fold)


@pytest.mark.gpu
@pytest.mark.parametrize("lora_fold", [False, True])
def test_mixed_batch_matches_peft_alora_on_cuda(cuda_device: torch.device, tiny_llama: Path,
                                                alora_adapters: dict[str, Path],
                                                lora_fold: bool) -> None:
    """The Triton kernels (and the fold, CUDA graphs) with base and adapted rows of one
    request in one launch."""
    check_mixed_batch(tiny_llama, alora_adapters, "cuda", lora_fold=lora_fold, graphs=True)


def check_mixed_batch(tiny_llama: Path, alora_adapters: dict[str, Path], device: str, *,
                      lora_fold: bool, graphs: bool = False) -> None:
    engine = build_engine(EngineSpec.of(
        tiny_llama, dtype="float32", device=device, max_num_seqs=6, max_num_batched_tokens=16,
        num_kv_blocks=24 + adapter_pages(tiny_llama, alora_adapters, 4), block_size=4,
        max_slots=4, max_rank=8, lora_fold=lora_fold, enable_cuda_graphs=graphs))
    handles = {name: engine.register_adapter(path) for name, path in alora_adapters.items()}
    assert handles["alora_a"].invocation_tokens == tuple(INVOKE_A)
    assert handles["attn_r4"].invocation_tokens is None
    outputs = serve_arrivals(engine, REQUESTS, handles, logprobs=5)
    hf = HFReference(tiny_llama, alora_adapters)
    for i, (prompt, adapter, max_tokens, _arrival) in enumerate(REQUESTS):
        out = outputs[f"r{i}"]
        ref_tokens, ref_logits = hf.greedy(prompt, max_tokens, adapter)
        assert list(out.token_ids) == ref_tokens, f"request r{i} ({adapter})"
        ref_lp = ref_logits.log_softmax(-1)
        for step_lp, ref_row in zip(out.logprobs, ref_lp, strict=True):
            ids = torch.tensor([step_lp.token_id] + [t for t, _ in step_lp.top])
            got = torch.tensor([step_lp.logprob] + [v for _, v in step_lp.top])
            torch.testing.assert_close(got, ref_row[ids], **LOGPROB_TOL)


def test_the_adapter_changes_only_rows_from_the_invocation_on(
        tiny_llama: Path, alora_adapters: dict[str, Path]) -> None:
    """The reference has teeth: PEFT's aLoRA logits differ from the base's once invoked,
    and the same factors always on (a plain LoRA) differ from the aLoRA's."""
    hf = HFReference(tiny_llama, alora_adapters)
    prompt = [5, 17, 33, 9, 99, 100]
    _, alora = hf.greedy(prompt, 3, "alora_a")
    _, base = hf.greedy(prompt, 3, None)
    assert (alora[0] - base[0]).abs().max() > 1e-2


def test_a_prompt_without_the_invocation_is_refused_or_served_as_base(
        tiny_llama: Path, alora_adapters: dict[str, Path]) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, dtype="float32", device="cpu",
                                        max_num_seqs=4, max_num_batched_tokens=32,
                                        num_kv_blocks=64, block_size=4, max_slots=4,
                                        max_rank=8))
    handle = engine.register_adapter(alora_adapters["alora_a"])
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompt = [5, 99, 6, 100, 7]  # 99 and 100, but never 99 followed by 100
    with pytest.raises(AloraNotInvoked) as err:
        engine.add_request("no", prompt, params, handle)
    assert err.value.code == "ALORA_NOT_INVOKED"
    assert err.value.detail["invocation_tokens"] == INVOKE_A
    assert not engine.has_unfinished()
    engine.add_request("no", prompt, params)  # the refusal left nothing behind: the id is free
    engine.abort("no")
    engine.add_request("as-base", prompt, params, handle, base_if_not_invoked=True)
    engine.add_request("base", prompt, params)
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.token_ids)
    assert done["as-base"] == done["base"]


def test_base_then_three_aloras_compute_the_shared_prefix_once(
        tiny_llama: Path, alora_adapters: dict[str, Path]) -> None:
    """A base request caches the conversation; aLoRA requests on it (invocation appended)
    reuse every full block before their invocation, a plain LoRA reuses nothing, and every
    answer still equals PEFT's."""
    engine = build_engine(EngineSpec.of(tiny_llama, dtype="float32", device="cpu",
                                        max_num_seqs=4, max_num_batched_tokens=64,
                                        num_kv_blocks=96, block_size=4, max_slots=4,
                                        max_rank=8, enable_prefix_caching=True))
    handles = {name: engine.register_adapter(path) for name, path in alora_adapters.items()}
    context = [int(t) for t in torch.randint(3, 90, (21,),
                                             generator=torch.Generator().manual_seed(5))]
    requests = [("base", context, None), ("a", [*context, *INVOKE_A], "alora_a"),
                ("b", [*context, *INVOKE_B], "alora_b"),
                ("a2", [*context, 1, *INVOKE_A], "alora_a"),
                ("lora", [*context, 1], "attn_r4")]
    hf = HFReference(tiny_llama, alora_adapters)
    cached = {}
    for rid, prompt, adapter in requests:  # one at a time: each sees the cache of the last
        engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=4,
                                                       ignore_eos=True),
                           handles[adapter] if adapter else None)
        tokens: list[int] = []
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    tokens = list(out.token_ids)
                    cached[rid] = out.num_cached_tokens
        assert tokens == hf.greedy(prompt, 4, adapter)[0], rid
    assert cached["base"] == 0
    # the context's 5 full blocks (20 tokens) precede every invocation (at 21 or 22)
    assert cached["a"] == cached["b"] == cached["a2"] == 20
    assert cached["lora"] == 0  # a plain LoRA's rows are adapted from position 0
