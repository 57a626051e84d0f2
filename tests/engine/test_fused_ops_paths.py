"""The engine with the fused Triton elementwise ops (dataplane.ops, interpreted on CPU)
gives the same tokens and logprobs as with their torch references, adapters and
prefill + decode rows mixed (RoPE + KV write, add-norm, SiLU * up in every layer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.ops import OpsError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _run(model_dir: Path, adapters: dict[str, Path], ops: str) -> list[tuple]:
    engine = build_engine(EngineSpec.of(model_dir, max_num_seqs=4, max_num_batched_tokens=16,
                                   num_kv_blocks=160, block_size=4, max_slots=3, max_rank=8,
                                   ops_backend=ops, device=DEVICE, enable_cuda_graphs=False))
    assert engine.model.layers[0].input_layernorm.ops_backend == ops  # type: ignore[union-attr]
    hs = [engine.register_adapter(adapters[n]) for n in ("all_r8", "mlp_rs2")]
    outs = engine.generate([[5, 17, 33, 9, 100, 7, 8, 1, 2], [1, 2, 3], [9] * 5],
                           SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                          logprobs=0), [hs[0], None, hs[1]])
    return [(o.token_ids, [lp.logprob for lp in o.logprobs or ()]) for o in outs]


def test_triton_ops_match_torch_ops(tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    want = _run(tiny_llama, tiny_adapters, "torch")
    got = _run(tiny_llama, tiny_adapters, "triton")
    assert [t for t, _ in got] == [t for t, _ in want]
    torch.testing.assert_close(torch.tensor([lp for _, lp in got]),
                               torch.tensor([lp for _, lp in want]), atol=2e-5, rtol=1e-4)


def test_unknown_ops_backend_is_rejected(tiny_llama: Path) -> None:
    with pytest.raises(OpsError):
        build_engine(EngineSpec.of(tiny_llama, max_num_seqs=2, num_kv_blocks=8, block_size=4,
                              max_slots=0, ops_backend="cuda-magic"))
