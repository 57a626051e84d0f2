"""Compress real PEFT adapters; members written back as PEFT dirs are checked with HF + PEFT."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir
from dataplane.collections import (
    JD_DIAG,
    JD_FULL,
    TENSORS_FILE,
    CollectionError,
    ReleaseRefused,
    read_bundle,
    write_bundle,
)
from dataplane.collections.compress import CompressionSpec, compress_collection
from dataplane.collections.member_peft import write_member_peft
from tests.engine.helpers import hf_logits

PROMPT = [3, 17, 5, 42, 9, 11, 2, 30]


def _h_artifacts(members: list[Path], base_dir: Path) -> list[str]:
    base = read_base_abi(base_dir)
    return [validate_peft_dir(m, base, ArtifactLimits()).h_artifact for m in members]


def _dense_updates(member: Path) -> dict[str, torch.Tensor]:
    """s · B A per module, straight from the PEFT files (float64, independent of our code)."""
    config = json.loads((member / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(member / "adapter_model.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118
            if key.endswith("lora_A.weight"):
                name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                a = f.get_tensor(key).double()
                b = f.get_tensor(key.replace("lora_A", "lora_B")).double()
                out[name] = scale * (b @ a)
    return out


def test_lossless_rank_member_serves_like_its_source_in_hf_peft(
        collection_base: Path, collection_members: list[Path], tmp_path: Path) -> None:
    base = read_base_abi(collection_base)
    spec = CompressionSpec(method=JD_FULL, rank=13, max_relative_error=Fraction(1, 10**5))
    bundle = compress_collection(collection_members, base, spec=spec,
                                 sources_h_artifact=_h_artifacts(collection_members,
                                                                 collection_base))
    assert bundle.metrics["max_relative_error"] < 1e-5  # R = sum of ranks covers all spans
    assert bundle.metrics["params"]["joint"] > 0
    write_bundle(bundle, tmp_path / "bundle")
    loaded = read_bundle(tmp_path / "bundle")
    assert loaded.h_collection == bundle.h_collection
    member = write_member_peft(loaded, 2, tmp_path / "member2")
    validate_peft_dir(member, base, ArtifactLimits())
    source = hf_logits(collection_base, PROMPT, collection_members[2])
    compressed = hf_logits(collection_base, PROMPT, member)
    plain = hf_logits(collection_base, PROMPT)
    assert (source - plain).abs().max() > 1e-2  # the adapter changes the output
    assert torch.allclose(compressed, source, atol=2e-4, rtol=0)


@pytest.mark.parametrize("method", [JD_FULL, JD_DIAG])
def test_lossy_rank_reports_errors_that_match_dense_reference(
        method: str, collection_base: Path, collection_members: list[Path]) -> None:
    base = read_base_abi(collection_base)
    digests = _h_artifacts(collection_members, collection_base)
    spec = CompressionSpec(method=method, rank=3, max_relative_error=Fraction(1))
    bundle = compress_collection(collection_members, base, spec=spec,
                                 sources_h_artifact=digests)
    for i, member in enumerate(collection_members):
        updates = _dense_updates(member)
        residual = energy = 0.0
        for name, delta in updates.items():
            u, v = (t.double() for t in bundle.bases(bundle.assignment[i], name))
            recon = u @ bundle.core(i, name).double() @ v.T
            residual += float(((delta - recon) ** 2).sum())
            energy += float((delta ** 2).sum())
        assert bundle.metrics["relative_error"][i] == pytest.approx(
            (residual / energy) ** 0.5, rel=1e-4)
    assert bundle.metrics["max_relative_error"] > 0.05
    strict = CompressionSpec(method=method, rank=3, max_relative_error=Fraction(1, 100))
    with pytest.raises(ReleaseRefused) as info:
        compress_collection(collection_members, base, spec=strict, sources_h_artifact=digests)
    assert info.value.code == "COLLECTION_RELEASE_REFUSED"
    assert info.value.detail["metrics"]["max_relative_error"] > 0.01


def test_tampered_bundle_is_refused(collection_base: Path, collection_members: list[Path],
                                    tmp_path: Path) -> None:
    base = read_base_abi(collection_base)
    bundle = compress_collection(
        collection_members, base, spec=CompressionSpec(rank=4, max_relative_error=Fraction(1)),
        sources_h_artifact=_h_artifacts(collection_members, collection_base))
    write_bundle(bundle, tmp_path / "b")
    data = bytearray((tmp_path / "b" / TENSORS_FILE).read_bytes())
    data[-3] ^= 0x01
    (tmp_path / "b" / TENSORS_FILE).write_bytes(bytes(data))
    with pytest.raises(CollectionError, match="digests"):
        read_bundle(tmp_path / "b")
    write_bundle(bundle, tmp_path / "c")
    doc = json.loads((tmp_path / "c" / "collection.json").read_text())
    doc["manifest"]["sources"][0] = "0" * 64
    (tmp_path / "c" / "collection.json").write_text(json.dumps(doc))
    with pytest.raises(CollectionError, match="H_collection"):
        read_bundle(tmp_path / "c")


def test_sources_must_match_their_digests_and_modules(
        collection_base: Path, collection_members: list[Path], tmp_path: Path) -> None:
    base = read_base_abi(collection_base)
    digests = _h_artifacts(collection_members, collection_base)
    spec = CompressionSpec(rank=4, max_relative_error=Fraction(1))
    with pytest.raises(CollectionError, match="H_artifact"):
        compress_collection(collection_members, base, spec=spec,
                            sources_h_artifact=[digests[1], *digests[1:]])
    from dataplane.assets import make_peft_adapter

    other = make_peft_adapter(collection_base, tmp_path / "other", seed=9, rank=2, alpha=2,
                              target_modules=["q_proj"])
    with pytest.raises(CollectionError, match="same modules"):
        compress_collection([*collection_members[:2], other], base, spec=spec,
                            sources_h_artifact=[*digests[:2],
                                                *_h_artifacts([other], collection_base)])


def test_an_activated_lora_is_not_a_member(collection_base: Path,
                                           collection_members: list[Path],
                                           tmp_path: Path) -> None:
    """A collection's members are served on every row of their requests, so an aLoRA
    (whose rows before its invocation are base rows) is refused as a source."""
    import shutil

    base = read_base_abi(collection_base)
    first = collection_members[0]
    alora = tmp_path / "alora"
    shutil.copytree(first, alora)  # the first member's factors, activated by [5, 6]
    config = json.loads((alora / "adapter_config.json").read_text())
    config["alora_invocation_tokens"] = [5, 6]
    (alora / "adapter_config.json").write_text(json.dumps(config))
    members = [alora, *collection_members[1:]]
    with pytest.raises(CollectionError) as err:
        compress_collection(members, base, spec=CompressionSpec(rank=4,
                                                                max_relative_error=Fraction(1)),
                            sources_h_artifact=_h_artifacts(members, collection_base))
    assert err.value.detail["rejection"] == "alora_unsupported"
    assert err.value.detail["index"] == 0
