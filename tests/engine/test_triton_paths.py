"""The engine on its Triton paths — the kernels' LoRA backend and the paged decode attention
kernel (interpreted on CPU, compiled on CUDA) — gives the same tokens and logprobs as on the
torch paths, adapters mixed in one batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from tests.kernels.lora_cases import enable_folded_silu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _run(model_dir: Path, adapters: dict[str, Path], backend: str) -> list[tuple]:
    engine = build_engine(EngineSpec.of(model_dir, max_num_seqs=4, max_num_batched_tokens=16,
                                   num_kv_blocks=160, block_size=4, max_slots=3, max_rank=8,
                                   lora_backend=backend, attention_backend=backend,
                                   device=DEVICE))
    hs = [engine.register_adapter(adapters[n]) for n in ("all_r8", "attn_r4")]
    outs = engine.generate([[5, 17, 33, 9, 100, 7], [1, 2, 3], [9] * 5],
                           SamplingParams(temperature=0, max_tokens=3, ignore_eos=True,
                                          logprobs=0), [hs[0], None, hs[1]])
    return [(o.token_ids, [lp.logprob for lp in o.logprobs or ()]) for o in outs]


@pytest.mark.parametrize("fused", ["1", "0"], ids=["fused-decode", "two-kernel-folded-silu"])
def test_triton_paths_match_torch_paths(tiny_llama: Path, tiny_adapters: dict[str, Path],
                                        fused: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both Triton LoRA paths: the fused decode launch, and two kernels everywhere (the
    gate/up expand folded into SiLU·mul)."""
    monkeypatch.setenv("ADAPTERPLANE_LORA_FUSED", fused)
    if fused == "0":
        enable_folded_silu(monkeypatch)
    want = _run(tiny_llama, tiny_adapters, "torch")
    got = _run(tiny_llama, tiny_adapters, "triton")
    assert [t for t, _ in got] == [t for t, _ in want]
    torch.testing.assert_close(torch.tensor([lp for _, lp in got]),
                               torch.tensor([lp for _, lp in want]), atol=2e-5, rtol=1e-4)


def test_warm_up_row_counts_cover_every_power_of_two_and_the_maximum() -> None:
    from dataplane.engine.model_runner import warm_up_row_counts

    assert warm_up_row_counts(1) == [1]
    assert warm_up_row_counts(200) == [1, 2, 4, 8, 16, 32, 64, 128, 200]
    assert warm_up_row_counts(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_lora_warm_up_changes_nothing(tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    """The warm-up launches the Triton LoRA path once per row count and projection shape
    with no row on an adapter; generation after it equals generation without it."""
    want = _run(tiny_llama, tiny_adapters, "triton")
    engine = build_engine(EngineSpec.of(tiny_llama, max_num_seqs=4, max_num_batched_tokens=16,
                                   num_kv_blocks=160, block_size=4, max_slots=3, max_rank=8,
                                   lora_backend="triton", attention_backend="triton",
                                   device=DEVICE))
    hs = [engine.register_adapter(tiny_adapters[n]) for n in ("all_r8", "attn_r4")]
    cache = engine.runner.cache
    k_before, v_before = cache.k.clone(), cache.v.clone()
    # 5 row counts (1, 2, 4, 8, 16) x the tiny model's projection shapes
    shapes = {(lin.in_features, tuple(lin.out_features))
              for _, _, lin in engine.model.lora_linears()}
    assert engine.runner.warm_up_lora() == 5 * len(shapes)
    assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before)
    outs = engine.generate([[5, 17, 33, 9, 100, 7], [1, 2, 3], [9] * 5],
                           SamplingParams(temperature=0, max_tokens=3, ignore_eos=True,
                                          logprobs=0), [hs[0], None, hs[1]])
    got = [(o.token_ids, [lp.logprob for lp in o.logprobs or ()]) for o in outs]
    assert got == want
