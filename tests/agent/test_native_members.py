"""An agent serves a linked artifact natively only when its factors are the bundle's member:
`member_mismatch` against real fitted members, and `ArtifactFetcher` falling back to the
plain LoRA (recording why) when the bundle is missing, tampered or names another member."""

from __future__ import annotations

import hashlib
import shutil
from fractions import Fraction
from pathlib import Path

import pytest

from agent.artifacts import ArtifactFetcher
from agent.catalog import ArtifactInfo, CollectionLink
from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir
from dataplane.assets import make_peft_adapter, make_tiny_llama
from dataplane.collections import write_bundle
from dataplane.collections.bundle import CollectionBundle, read_bundle
from dataplane.collections.compress import CompressionSpec, compress_collection
from dataplane.collections.member_peft import write_member_peft
from dataplane.engine.adapters import load_peft_adapter
from dataplane.engine.native_members import NativeMember, member_mismatch


def _files(directory: Path) -> dict[str, dict[str, object]]:
    return {p.name: {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                     "size": p.stat().st_size, "url": p.resolve().as_uri()}
            for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path],
                                                               list[Path]]:
    root = tmp_path_factory.mktemp("native-members")
    base = make_tiny_llama(root / "base", seed=9)
    sources = [make_peft_adapter(base, root / f"s{i}", seed=80 + i, rank=2, alpha=4,
                                 target_modules=["q_proj", "o_proj"]) for i in range(2)]
    abi = read_base_abi(base)
    digests = [validate_peft_dir(s, abi, ArtifactLimits()).h_artifact for s in sources]
    bundle = compress_collection(sources, abi, sources_h_artifact=digests, spec=CompressionSpec(
        rank=4, max_relative_error=Fraction(1, 10**5)))
    write_bundle(bundle, root / "bundle")
    members = [write_member_peft(bundle, i, root / f"m{i}") for i in range(2)]
    return base, root / "bundle", sources, members


def test_member_mismatch_accepts_only_the_member_itself(
        fitted: tuple[Path, Path, list[Path], list[Path]]) -> None:
    base, bundle_dir, sources, members = fitted
    abi = read_base_abi(base)
    bundle = read_bundle(bundle_dir)
    m0, m1 = (load_peft_adapter(m, abi, 8) for m in members)
    assert member_mismatch(bundle, 0, m0) is None
    assert member_mismatch(bundle, 1, m1) is None
    assert "B is not" in (member_mismatch(bundle, 1, m0) or "")  # same Vᵀ, other core
    assert "outside" in (member_mismatch(bundle, 2, m0) or "")
    source = load_peft_adapter(sources[0], abi, 8)  # the source it approximates exactly
    assert member_mismatch(bundle, 0, source) is not None  # is not the member's bytes


def _info(member: Path, base: Path, link: CollectionLink | None) -> ArtifactInfo:
    checked = validate_peft_dir(member, read_base_abi(base), ArtifactLimits())
    return ArtifactInfo(id=1, digest=checked.h_artifact, files=_files(member), max_rank=4,
                        roles=frozenset({"q_proj", "o_proj"}), total_bytes=0, collection=link)


def test_fetcher_serves_natively_or_falls_back_with_a_reason(
        fitted: tuple[Path, Path, list[Path], list[Path]], tmp_path: Path) -> None:
    base, bundle_dir, _sources, members = fitted
    h_collection = read_bundle(bundle_dir).h_collection
    fetcher = ArtifactFetcher(tmp_path / "cache", read_base_abi(base), 8,
                              native_collections=True)
    link = CollectionLink(h_collection, 1, _files(bundle_dir))
    native = fetcher.load(_info(members[1], base, link))
    assert isinstance(native, NativeMember) and native.member == 1
    assert isinstance(native.bundle, CollectionBundle)
    wrong = fetcher.load(_info(members[0], base, link))  # linked to member 1's position
    assert not isinstance(wrong, NativeMember)
    assert "B is not" in fetcher.native_refused[_info(members[0], base, None).digest]
    tampered = tmp_path / "tampered"
    shutil.copytree(bundle_dir, tampered)
    data = bytearray((tampered / "collection.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (tampered / "collection.safetensors").write_bytes(bytes(data))
    fresh = ArtifactFetcher(tmp_path / "cache2", read_base_abi(base), 8,
                            native_collections=True)
    bad = CollectionLink(h_collection, 0, _files(tampered))
    plain = fresh.load(_info(members[0], base, bad))
    assert not isinstance(plain, NativeMember)
    assert "bundle unavailable" in next(iter(fresh.native_refused.values()))
    off = ArtifactFetcher(tmp_path / "cache3", read_base_abi(base), 8)
    assert not isinstance(off.load(_info(members[1], base, link)), NativeMember)


def test_collection_blocks_on_one_gpu(
        fitted: tuple[Path, Path, list[Path], list[Path]]) -> None:
    """The agent's engine gives members `max_slots` slots of their own above the pool's;
    tensor parallelism is refused."""
    from agent.config import AgentSettings
    from agent.engine_factory import agent_engine
    from agent.metrics import AgentMetrics

    base = fitted[0]
    engine, _ = agent_engine(AgentSettings(model_dir=base, device="cpu",  # type: ignore[arg-type]
                                           dtype="float32", max_slots=3, collection_blocks=2,
                                           collection_rank=4), AgentMetrics())
    assert engine.pool.pool.slots.num_slots == 3
    assert engine.runner.max_slots == 6 and engine.collections.slots == range(3, 6)
    assert {t.blocks for t in engine.runner.collections.values()} == {2}
    with pytest.raises(ValueError, match="one GPU"):
        agent_engine(AgentSettings(model_dir=base, device="cpu",  # type: ignore[arg-type]
                                   dtype="float32", tp_degree=2, collection_blocks=2),
                     AgentMetrics())
