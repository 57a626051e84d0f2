"""GPU (marked `gpu`, skipped without CUDA): collection members served natively in decode
steps replayed from CUDA graphs (plain, with the LoRA fold, in mixed steps' piecewise
graphs, beside the unified pool's LoRA slots) give HF + PEFT's greedy tokens
and log-probabilities on the members written back as PEFT dirs, beside an ordinary LoRA
and base rows in the same batches."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import torch

from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir
from dataplane.collections import JD_FULL
from dataplane.collections.compress import CompressionSpec, compress_collection
from dataplane.collections.member_peft import write_member_peft
from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.adapters import AdapterHandle
from tests.engine.helpers import HFReference

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 17, 33, 9, 100, 7, 250, 3, 64], [1, 2, 3], [9, 9, 9, 31, 200],
           [60, 61, 62, 63, 64, 65], [3, 141, 59]]
MAX_TOKENS = 8


@pytest.mark.parametrize("mode", ["graphs", "graphs-fold", "piecewise", "collections-only"])
def test_native_members_in_cuda_graphs_match_hf(cuda_device: torch.device,
                                                collection_base: Path,
                                                collection_members: list[Path],
                                                tmp_path: Path, mode: str) -> None:
    abi = read_base_abi(collection_base)
    digests = [validate_peft_dir(m, abi, ArtifactLimits()).h_artifact
               for m in collection_members]
    bundle = compress_collection(collection_members, abi, sources_h_artifact=digests,
                                 spec=CompressionSpec(method=JD_FULL, rank=5, clusters=2,
                                                      max_relative_error=Fraction(1)))
    lora: AdapterHandle | None
    engine = build_engine(EngineSpec.of(collection_base, dtype="float32", device="cuda",
                                        max_num_seqs=8, max_num_batched_tokens=64,
                                        num_kv_blocks=64, block_size=4, max_slots=6,
                                        max_rank=0 if mode == "collections-only" else 4,
                                        collection_blocks=2, collection_rank=8,
                                        lora_fold=mode == "graphs-fold",
                                        enable_piecewise_graphs=mode == "piecewise"))
    loaded = engine.load_collection(bundle)
    lora = (None if mode == "collections-only"
            else engine.register_adapter(collection_members[0]))
    if lora is not None:  # members take slots of their own above the pool's
        assert all(m.slot >= 6 for m in loaded.members) and lora.slot < 6
    written = {f"c{i}": write_member_peft(bundle, i, tmp_path / f"c{i}")
               for i in range(len(loaded.members))}
    handles = [loaded.members[0], loaded.members[1], None, lora, loaded.members[3]]
    names = ["c0", "c1", None, "src0" if lora is not None else None, "c3"]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outs = engine.generate(PROMPTS, params, handles)
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.replays > 0  # type: ignore[attr-defined]
    if mode == "piecewise":
        assert engine.runner.piecewise is not None
    hf = HFReference(collection_base, {**written, "src0": collection_members[0]})
    for prompt, name, out in zip(PROMPTS, names, outs, strict=True):
        ref_tokens, ref_logits = hf.greedy(prompt, MAX_TOKENS, name)
        assert list(out.token_ids) == ref_tokens, name
        want = ref_logits.log_softmax(-1)[torch.arange(MAX_TOKENS), torch.tensor(ref_tokens)]
        assert out.logprobs is not None
        got = torch.tensor([lp.logprob for lp in out.logprobs])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
