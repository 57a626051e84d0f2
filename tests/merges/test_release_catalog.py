"""Aliases pointing at merged releases, on the embedded default (SQLite, file:// storage, the
merge job run inline by the real task): publish, rollback both ways, refusals that change
nothing, and what agents of each base are sent."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane.app import create_app
from controlplane.contracts import Capabilities
from controlplane.migrate import upgrade_to_head
from dataplane.artifacts import read_base_abi
from tests.controlplane.cp_helpers import bootstrap_token, close_app, make_settings, push_dir
from tests.merges.conftest import MergeAssets

NS = "acme"


@dataclass
class Registry:
    client: TestClient
    store_root: Path
    h_base: str
    artifact: dict[str, Any]
    merge: dict[str, Any]

    def alias(self, action: str, alias: str = "support", **body: Any) -> Any:
        return self.client.post(f"/v1/namespaces/{NS}/aliases/{alias}/{action}", json=body)

    def history(self, alias: str = "support") -> list[dict[str, Any]]:
        items = self.client.get(f"/v1/namespaces/{NS}/aliases/{alias}/history").json()["items"]
        return list(items)


def _merge(client: TestClient, h_base: str, base: Path, artifact_id: int,
           **extra: Any) -> dict[str, Any]:
    body = {"name": "support-merged", "base": h_base, "dtype": "fp32",
            "base_uri": f"file://{base}", "adapters": [{"artifact": artifact_id}], **extra}
    r = client.post(f"/v1/namespaces/{NS}/merges", json=body)
    assert r.status_code in (200, 202), r.text
    return dict(client.get(f"/v1/namespaces/{NS}/merges/{r.json()['id']}").json())


@pytest.fixture
def registry(tmp_path: Path, merge_assets: MergeAssets) -> Iterator[Registry]:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade_to_head(url)
    settings = make_settings(url, tmp_path / "var", allow_file_uri_import=True,
                             file_import_roots=[merge_assets.base.parent])
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {bootstrap_token(settings)}"
        abi = read_base_abi(merge_assets.base).to_record()
        h_base = str(abi["h_base"])
        assert client.post("/v1/bases", json={"name": "tiny", "abi": abi}).status_code == 201
        assert client.post("/v1/namespaces", json={"name": NS}).status_code == 201
        pushed = push_dir(client, dict(client.headers), NS, h_base, merge_assets.plain)
        assert pushed.status_code == 202, pushed.text
        artifact = client.get(f"/v1/namespaces/{NS}/artifacts/{pushed.json()['id']}").json()
        assert artifact["state"] == "validated", artifact
        merge = _merge(client, h_base, merge_assets.base, artifact["id"])
        assert merge["state"] == "merged", merge
        yield Registry(client, tmp_path / "var", h_base, artifact, merge)
    close_app(app)


def _register(client: TestClient, name: str, h_base: str) -> tuple[int, int, dict[str, str]]:
    token = client.post("/v1/tokens", json={"name": name, "grants": [], "is_agent": True})
    headers = {"Authorization": f"Bearer {token.json()['token']}"}
    caps = Capabilities(base=h_base, dtypes=["float32"], max_rank=16, targets=["q_proj", "v_proj"],
                        adapter_slots=2, pool_pages=100, page_bytes=4096, kv_reserve_pages=50)
    me = client.post("/v1/agents/register", headers=headers, json={
        "name": name, "url": "http://127.0.0.1:1", "capabilities": caps.model_dump()}).json()
    return int(me["id"]), int(me["worker_epoch"]), headers


def _desired(client: TestClient, agent: tuple[int, int, dict[str, str]]) -> dict[str, Any]:
    agent_id, epoch, headers = agent
    r = client.get(f"/v1/agents/{agent_id}/desired-state", headers=headers,
                   params={"worker_epoch": epoch, "after": -1, "wait": 0})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_publish_a_release_and_roll_back_both_ways(registry: Registry) -> None:
    reg = registry
    assert reg.alias("publish", artifact=str(reg.artifact["id"])).status_code == 201
    published = reg.alias("publish", release=str(reg.merge["id"]), expected_generation=1)
    assert published.status_code == 201, published.text
    release = {"id": reg.merge["id"], "name": "support-merged", "digest": reg.merge["digest"],
               "base": reg.merge["merged_base"]}
    assert (published.json()["artifact"], published.json()["release"]) == (None, release)
    resolved = reg.client.get(f"/v1/namespaces/{NS}/aliases/support").json()
    assert resolved["release"] == release and resolved["base"] == reg.h_base
    by_digest = reg.alias("publish", release=f"sha256:{reg.merge['digest']}")
    assert by_digest.json()["release"] == release  # the same release named by H_merged

    back = reg.alias("rollback", to_generation=1)
    assert back.status_code == 201, back.text
    assert back.json()["artifact"]["id"] == reg.artifact["id"] and back.json()["release"] is None
    again = reg.alias("rollback")  # the default: the newest earlier different target
    assert again.json()["release"] == release and again.json()["generation"] == 5
    assert [(g["generation"], g["action"], bool(g["release"])) for g in reg.history()] == [
        (5, "rollback", True), (4, "rollback", False), (3, "publish", True),
        (2, "publish", True), (1, "publish", False)]
    assert reg.alias("retire").status_code == 201
    gone = reg.client.get(f"/v1/namespaces/{NS}/aliases/support")
    assert (gone.status_code, gone.json()["code"]) == (410, "ALIAS_RETIRED")


def test_refusals_change_nothing(registry: Registry, merge_assets: MergeAssets) -> None:
    reg = registry
    assert reg.alias("publish", artifact=str(reg.artifact["id"])).status_code == 201
    for body in ({}, {"artifact": str(reg.artifact["id"]), "release": str(reg.merge["id"])}):
        r = reg.alias("publish", **body)
        assert (r.status_code, r.json()["code"]) == (422, "VALIDATION_ERROR")
    inexact = _merge(reg.client, reg.h_base, merge_assets.base, reg.artifact["id"],
                     max_relative_error="0")
    assert inexact["state"] == "rejected", inexact
    r = reg.alias("publish", release=str(inexact["id"]))
    assert (r.status_code, r.json()["code"]) == (409, "INVALID_STATE")
    missing = reg.alias("publish", release="999999")
    assert (missing.status_code, missing.json()["code"]) == (404, "NOT_FOUND")

    other_abi = read_base_abi(merge_assets.other_base).to_record()
    assert reg.client.post("/v1/bases", json={"name": "other", "abi": other_abi}).status_code == 201
    other = push_dir(reg.client, dict(reg.client.headers), NS, str(other_abi["h_base"]),
                     merge_assets.other).json()
    assert reg.alias("publish", alias="elsewhere", artifact=str(other["id"])).status_code == 201
    r = reg.alias("publish", alias="elsewhere", release=str(reg.merge["id"]))
    assert (r.status_code, r.json()["code"]) == (422, "BASE_MISMATCH")
    assert r.json()["detail"]["release_source_base"] == reg.h_base

    weights = next(name for name in reg.merge["files"] if name.endswith(".safetensors"))
    blob = next(p for p in reg.store_root.rglob("*")
                if p.is_file() and p.name == Path(reg.merge["files"][weights]["key"]).name)
    blob.write_bytes(b"\0" + blob.read_bytes()[1:])
    r = reg.alias("publish", release=str(reg.merge["id"]))
    assert (r.status_code, r.json()["code"]) == (409, "ARTIFACT_CORRUPT")
    assert r.json()["detail"]["release_id"] == reg.merge["id"]
    assert [g["generation"] for g in reg.history()] == [1]  # nothing was appended


def test_agents_of_each_base_are_sent_the_release(registry: Registry) -> None:
    reg = registry
    assert reg.alias("publish", artifact=str(reg.artifact["id"])).status_code == 201
    assert reg.alias("publish", release=str(reg.merge["id"])).status_code == 201
    source = _register(reg.client, "source-0", reg.h_base)
    merged = _register(reg.client, "merged-0", str(reg.merge["merged_base"]))
    for agent in (source, merged):
        state = _desired(reg.client, agent)
        (alias,) = state["aliases"]
        assert alias["base"] == reg.h_base and alias["current_generation"] == 2
        current, first = alias["generations"]
        assert current["artifact"] is None
        assert current["release"] == {"id": reg.merge["id"], "digest": reg.merge["digest"],
                                      "base": reg.merge["merged_base"]}
        assert first["artifact"]["digest"] == reg.artifact["digest"] and "release" not in first
        assert state["prefetch"] == []  # a release loads no adapter anywhere
    unrelated = _register(reg.client, "unrelated-0", "0" * 64)
    assert _desired(reg.client, unrelated)["aliases"] == []
    routing = reg.client.get("/v1/fleet/routing").json()
    (route,) = routing["aliases"]
    assert route["digest"] is None and route["release"]["base"] == reg.merge["merged_base"]
