"""In-process pieces: model-name parsing, catalog resolution, artifact fetch checks."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from agent.artifacts import ArtifactFetcher
from agent.catalog import (
    AgentCatalog,
    AliasRetired,
    ArtifactInfo,
    BadModelName,
    LoadFailed,
    ModelRef,
    UnknownAlias,
    parse_desired_state,
)
from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir

from .conftest import AgentAssets


def wire_artifact(adapter: Path, base: Path, art_id: int = 1) -> dict[str, Any]:
    """What the control plane sends for a validated artifact (file:// URLs)."""
    validated = validate_peft_dir(adapter, read_base_abi(base), ArtifactLimits(max_rank=64))
    files = {}
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        data = (adapter / name).read_bytes()
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                       "url": (adapter / name).as_uri()}
    return {"id": art_id, "digest": validated.h_artifact, "files": files,
            "validated_record": validated.to_record()}


def test_model_ref_parsing() -> None:
    assert ModelRef.parse("acme/bot") == ModelRef("acme", "bot", None)
    assert ModelRef.parse("acme/bot@12") == ModelRef("acme", "bot", 12)
    for bad in ("bot", "Acme/bot", "acme/bot@x", "acme/", "a/b/c"):
        with pytest.raises(BadModelName):
            ModelRef.parse(bad)


def test_resolve_current_pinned_retired_unknown(agent_assets: AgentAssets) -> None:
    art = wire_artifact(agent_assets.adapters["a"], agent_assets.base)
    doc = {"version": 5, "agent_id": 1, "worker_epoch": 1, "aliases": [
        {"namespace": "ns", "alias": "live", "current_generation": 2, "prefetch": True,
         "generations": [{"generation": 2, "action": "publish", "artifact": art},
                         {"generation": 1, "action": "publish", "artifact": art}]},
        {"namespace": "ns", "alias": "gone", "current_generation": 2,
         "generations": [{"generation": 2, "action": "retire", "artifact": None},
                         {"generation": 1, "action": "publish", "artifact": art}]},
        {"namespace": "ns", "alias": "forged", "current_generation": 1,
         "generations": [{"generation": 1, "action": "publish",
                          "artifact": {**art, "digest": "0" * 64}}]}]}
    catalog = AgentCatalog()
    catalog.update(*parse_desired_state(doc))
    assert catalog.resolve(ModelRef("ns", "live")).generation == 2
    assert catalog.resolve(ModelRef("ns", "live", 1)).generation == 1
    assert catalog.resolve(ModelRef("ns", "gone", 1)).generation == 1  # pinned, pre-retire
    with pytest.raises(AliasRetired):
        catalog.resolve(ModelRef("ns", "gone"))
    with pytest.raises(UnknownAlias):
        catalog.resolve(ModelRef("ns", "nope"))
    with pytest.raises(UnknownAlias):
        catalog.resolve(ModelRef("ns", "live", 7))
    with pytest.raises(LoadFailed):  # a record that does not re-derive its digest
        catalog.resolve(ModelRef("ns", "forged"))
    assert [i.digest for i in catalog.prefetch_targets()] == [art["digest"]]


def test_fetch_verifies_every_file_and_the_semantic_digest(agent_assets: AgentAssets,
                                                           tmp_path: Path) -> None:
    base = agent_assets.base
    abi = read_base_abi(base)
    good = ArtifactInfo.from_wire(wire_artifact(agent_assets.adapters["b"], base))
    fetcher = ArtifactFetcher(tmp_path / "cache", abi, max_rank=8)
    loaded = fetcher.load(good)
    assert loaded.max_rank == 8 and fetcher.cache_misses == 2
    fetcher.load(good)
    assert fetcher.cache_hits == 2  # verified cache files, no second download

    corrupt = dict(good.files)
    corrupt["adapter_model.safetensors"] = {**corrupt["adapter_model.safetensors"],
                                            "sha256": "1" * 64}
    with pytest.raises(LoadFailed):
        fetcher.load(ArtifactInfo(good.id, good.digest, corrupt, good.max_rank, good.roles,
                                  good.total_bytes))
    # the right files under another artifact's name: the semantic digest check refuses
    other = ArtifactInfo.from_wire(wire_artifact(agent_assets.adapters["c"], base))
    swapped = ArtifactInfo(other.id, other.digest, good.files, other.max_rank, other.roles,
                           other.total_bytes)
    with pytest.raises(LoadFailed):
        fetcher.load(swapped)
