"""The engine with attention_backend="triton" (varlen prefill + paged decode kernels;
interpreted on CPU) gives the same greedy tokens and logprobs as the torch attention path,
with prompts long enough to be chunked (context > 0 in later chunks), a one-token prompt,
GQA, and a Mistral-style sliding window smaller than the prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dataplane.assets import make_tiny_llama
from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPTS = [[5, 17, 33, 9, 100, 7, 8, 1, 4, 66, 12, 3, 90], [42], list(range(3, 23)),
           [5, 17, 33, 9, 100, 7, 8, 1, 71]]


@pytest.fixture(scope="module", params=["llama", "mistral-window6"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = make_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=4)
    if request.param != "llama":  # same weights, Mistral config with a 6-token window
        cfg_path = dest / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=6)
        cfg_path.write_text(json.dumps(cfg))
    return dest


def _run(model_dir: Path, attention: str) -> list[tuple[list[int], list[float]]]:
    engine = build_engine(EngineSpec.of(model_dir, max_num_seqs=4, max_num_batched_tokens=8,
                                   num_kv_blocks=48, block_size=4, max_slots=0,
                                   attention_backend=attention, enable_cuda_graphs=False,
                                   device=DEVICE))
    windows = engine.model.config.layer_windows
    assert set(windows) == ({6} if "mistral" in (model_dir / "config.json").read_text()
                            else {None})
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                   logprobs=0))
    return [(list(o.token_ids), [lp.logprob for lp in o.logprobs or ()]) for o in outs]


def test_triton_attention_matches_torch_attention(model_dir: Path) -> None:
    want = _run(model_dir, "torch")
    got = _run(model_dir, "triton")
    assert [t for t, _ in got] == [t for t, _ in want]
    torch.testing.assert_close(torch.tensor([lp for _, lp in got]),
                               torch.tensor([lp for _, lp in want]), atol=2e-5, rtol=1e-4)
