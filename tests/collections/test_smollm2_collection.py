"""A collection of three SmolLM2-135M adapters (30 layers x q/v, 60 module fits): fitted at
the shared rank that covers every member, each member written back as a PEFT adapter
gives HF transformers + PEFT (and our engine) the same greedy tokens and near-identical
logits as its source; at a low shared rank the reconstruction error is reported and gated."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import torch

from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir
from dataplane.assets import make_peft_adapter
from dataplane.collections import ReleaseRefused
from dataplane.collections.compress import CompressionSpec, compress_collection
from dataplane.collections.member_peft import write_member_peft
from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from tests.engine.helpers import HFReference, hf_logits

PROMPT = [1, 504, 3458, 314, 260, 1167, 30]
RANKS = [4, 2, 2]


@pytest.fixture(scope="module")
def members(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("smol-members")
    return [make_peft_adapter(smollm2, root / f"m{i}", seed=60 + i, rank=r, alpha=2 * r,
                              target_modules=["q_proj", "v_proj"])
            for i, r in enumerate(RANKS)]


def test_lossless_collection_serves_like_its_sources(smollm2: Path, members: list[Path],
                                                     tmp_path: Path) -> None:
    base = read_base_abi(smollm2)
    digests = [validate_peft_dir(m, base, ArtifactLimits()).h_artifact for m in members]
    bundle = compress_collection(members, base, sources_h_artifact=digests, spec=CompressionSpec(
        rank=sum(RANKS), max_relative_error=Fraction(1, 10**4)))
    assert len(bundle.modules) == 60 and bundle.metrics["max_relative_error"] < 1e-4
    written = {f"m{i}": write_member_peft(bundle, i, tmp_path / f"c{i}")
               for i in range(len(members))}
    sources = {f"m{i}": m for i, m in enumerate(members)}
    ref = HFReference(smollm2, {**sources, **{f"c{i}": p for i, p in
                                              enumerate(written.values())}})
    for i in range(len(members)):
        want, _ = ref.greedy(PROMPT, 4, f"m{i}")
        got, _ = ref.greedy(PROMPT, 4, f"c{i}")
        assert got == want
    # our engine serves the written-back members like any adapter: the sources' tokens
    engine = build_engine(EngineSpec.of(smollm2, max_num_seqs=4, max_num_batched_tokens=32,
                                   num_kv_blocks=32, block_size=8, max_slots=3,
                                   max_rank=sum(RANKS)))
    handles = [engine.register_adapter(written[f"m{i}"]) for i in range(len(members))]
    outs = engine.generate([PROMPT] * len(members),
                           SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                           handles)
    for i, out in enumerate(outs):
        assert list(out.token_ids) == ref.greedy(PROMPT, 4, f"m{i}")[0]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    as_lora = engine.generate(["Hello"], greedy, [handles[0]])[0]
    del engine
    # and natively: one basis resident, three cores (the README's collections-only engine)
    native = build_engine(EngineSpec.of(smollm2, max_num_seqs=4, max_num_batched_tokens=32,
                                   num_kv_blocks=32, block_size=8, max_slots=3, max_rank=0,
                                   collection_blocks=1, collection_rank=sum(RANKS)))
    loaded = native.load_collection(bundle)
    outs = native.generate([PROMPT] * len(members),
                           SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                           list(loaded.members))
    for i, out in enumerate(outs):
        assert list(out.token_ids) == ref.greedy(PROMPT, 4, f"m{i}")[0]
    text = native.generate(["Hello"], greedy, [loaded.members[0]])[0]
    assert list(text.token_ids) == list(as_lora.token_ids) and text.text == as_lora.text
    source = hf_logits(smollm2, PROMPT, members[0])
    compressed = hf_logits(smollm2, PROMPT, written["m0"])
    assert (source - hf_logits(smollm2, PROMPT)).abs().max() > 1e-2
    assert torch.allclose(compressed, source, atol=1e-3, rtol=0)


def test_low_rank_collection_is_gated_by_its_error(smollm2: Path, members: list[Path]) -> None:
    base = read_base_abi(smollm2)
    digests = [validate_peft_dir(m, base, ArtifactLimits()).h_artifact for m in members]
    with pytest.raises(ReleaseRefused) as info:
        compress_collection(members, base, sources_h_artifact=digests, spec=CompressionSpec(
            rank=2, max_relative_error=Fraction(1, 100)))
    errors = info.value.detail["metrics"]["relative_error"]
    assert len(errors) == 3 and max(errors) > 0.01
