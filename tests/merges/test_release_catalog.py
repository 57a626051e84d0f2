"""Aliases pointing at merged releases, on the embedded default (SQLite, file:// storage, the
merge job run inline by the real task): publish, rollback both ways, refusals that change
nothing, and what agents of each base are sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from dataplane.artifacts import read_base_abi
from tests.controlplane.cp_helpers import push_dir
from tests.merges.conftest import MergeAssets
from tests.merges.registry import NS, Registry, register, submit_merge


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
    inexact = submit_merge(reg.client, reg.h_base, merge_assets.base, reg.artifact["id"],
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
    source = register(reg.client, "source-0", reg.h_base)
    merged = register(reg.client, "merged-0", str(reg.merge["merged_base"]))
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
    unrelated = register(reg.client, "unrelated-0", "0" * 64)
    assert _desired(reg.client, unrelated)["aliases"] == []
    routing = reg.client.get("/v1/fleet/routing").json()
    (route,) = routing["aliases"]
    assert route["digest"] is None and route["release"]["base"] == reg.merge["merged_base"]
