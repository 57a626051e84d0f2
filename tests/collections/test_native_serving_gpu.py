"""GPU (marked `gpu`, skipped without CUDA): collection members served natively in decode
steps replayed from CUDA graphs (plain, with the LoRA fold, and in mixed steps' piecewise
graphs, and beside the agent's unified pool with its fold) give HF + PEFT's greedy tokens
and log-probabilities on the members written back as PEFT dirs, beside an ordinary LoRA
and base rows in the same batches."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import torch

from agent.pool_slots import PoolSlots
from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir
from dataplane.collections import JD_FULL
from dataplane.collections.compress import CompressionSpec, compress_collection
from dataplane.collections.member_peft import write_member_peft
from dataplane.core import SamplingParams
from dataplane.engine.adapters import AdapterHandle, load_peft_adapter
from dataplane.engine.engine import Engine, EngineConfig
from dataplane.models import load_model
from tests.engine.helpers import HFReference

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 17, 33, 9, 100, 7, 250, 3, 64], [1, 2, 3], [9, 9, 9, 31, 200],
           [60, 61, 62, 63, 64, 65], [3, 141, 59]]
MAX_TOKENS = 8


def _pool_engine(base: Path) -> tuple[Engine, PoolSlots]:
    """The agent's layout: LoRA factors in the unified pool (6 slots, folded decode steps),
    members in 6 slots of their own above the pool's."""
    abi = read_base_abi(base)
    model = load_model(base, torch.float32, torch.device("cuda"))
    slots = PoolSlots.for_model(model, num_pages=64, block_size=4, max_slots=6, max_rank=4,
                                member_slots=6)
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64,
                          block_size=4, max_slots=12, max_rank=4, collection_blocks=2,
                          collection_rank=8, enable_cuda_graphs=False, external_factors=True)
    engine = Engine(model, config, abi.h_base, abi, kv_pages=slots.kv_view,
                    kv_cache=slots.kv_cache)
    slots.attach(engine)
    slots.enable_fold()
    assert engine.capture_cuda_graphs()
    return engine, slots


@pytest.mark.parametrize("mode", ["graphs", "graphs-fold", "piecewise", "collections-only",
                                  "pool-fold"])
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
    if mode == "pool-fold":
        engine, pool = _pool_engine(collection_base)
        loaded = engine.load_collection(bundle)
        assert all(m.slot >= 6 for m in loaded.members)  # above the pool's slots
        lora = pool.load("src0", load_peft_adapter(collection_members[0], abi, 4))
    else:
        engine = Engine.from_model_dir(collection_base, dtype="float32", device="cuda",
                                       max_num_seqs=8, max_num_batched_tokens=64,
                                       num_kv_blocks=64, block_size=4, max_slots=6,
                                       max_rank=0 if mode == "collections-only" else 4,
                                       collection_blocks=2, collection_rank=8,
                                       lora_fold=mode == "graphs-fold",
                                       enable_piecewise_graphs=mode == "piecewise")
        loaded = engine.load_collection(bundle)
        lora = (None if mode == "collections-only"
                else engine.register_adapter(collection_members[0]))
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
