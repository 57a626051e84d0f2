"""The engine on its Triton paths — the kernels' LoRA backend and the paged decode attention
kernel (interpreted on CPU, compiled on CUDA) — gives the same tokens and logprobs as on the
torch paths, adapters mixed in one batch."""

from __future__ import annotations

from pathlib import Path

import torch

from dataplane.core import SamplingParams
from dataplane.engine.engine import Engine

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _run(model_dir: Path, adapters: dict[str, Path], backend: str) -> list[tuple]:
    engine = Engine.from_model_dir(model_dir, max_num_seqs=4, max_num_batched_tokens=16,
                                   num_kv_blocks=32, block_size=4, max_slots=3, max_rank=8,
                                   lora_backend=backend, attention_backend=backend,
                                   device=DEVICE)
    hs = [engine.register_adapter(adapters[n]) for n in ("all_r8", "attn_r4")]
    outs = engine.generate([[5, 17, 33, 9, 100, 7], [1, 2, 3], [9] * 5],
                           SamplingParams(temperature=0, max_tokens=3, ignore_eos=True,
                                          logprobs=0), [hs[0], None, hs[1]])
    return [(o.token_ids, [lp.logprob for lp in o.logprobs or ()]) for o in outs]


def test_triton_paths_match_torch_paths(tiny_llama: Path,
                                              tiny_adapters: dict[str, Path]) -> None:
    want = _run(tiny_llama, tiny_adapters, "torch")
    got = _run(tiny_llama, tiny_adapters, "triton")
    assert [t for t, _ in got] == [t for t, _ in want]
    torch.testing.assert_close(torch.tensor([lp for _, lp in got]),
                               torch.tensor([lp for _, lp in want]), atol=2e-5, rtol=1e-4)
