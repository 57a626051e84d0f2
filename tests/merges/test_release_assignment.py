"""Base placement on the embedded default: an admin assigns an agent a merged release to
serve as its base, the heartbeat answer tells the agent, and every refusal changes
nothing (the agent keeps the assignment it had)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from controlplane.contracts import HeartbeatRequest
from dataplane.artifacts import read_base_abi
from tests.merges.conftest import MergeAssets
from tests.merges.registry import NS, Registry, register, submit_merge

Agent = tuple[int, int, dict[str, str]]


def _heartbeat(client: TestClient, agent: Agent) -> dict[str, Any]:
    agent_id, epoch, headers = agent
    body = HeartbeatRequest(worker_epoch=epoch, catalog_version=0).model_dump()
    r = client.post(f"/v1/agents/{agent_id}/heartbeat", headers=headers, json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _reregister(client: TestClient, name: str, agent: Agent, h_base: str) -> Agent:
    """A new process of `agent` (its token), now serving `h_base`."""
    caps = client.get(f"/v1/agents/{agent[0]}").json()["capabilities"]
    me = client.post("/v1/agents/register", headers=agent[2], json={
        "name": name, "url": "http://127.0.0.1:1", "capabilities": {**caps, "base": h_base}})
    assert me.status_code == 201, me.text
    return int(me.json()["id"]), int(me.json()["worker_epoch"]), agent[2]


def _assign(client: TestClient, agent: Agent, release: str, namespace: str = NS,
            **kw: Any) -> Any:
    return client.post(f"/v1/agents/{agent[0]}/release",
                       json={"namespace": namespace, "release": release}, **kw)


def _assigned(client: TestClient, agent: Agent) -> Any:
    return client.get(f"/v1/agents/{agent[0]}").json()["release"]


def test_assign_and_clear_a_release(registry: Registry) -> None:
    reg = registry
    source = register(reg.client, "source-0", reg.h_base)
    assert _heartbeat(reg.client, source)["release_base"] is None
    want = {"id": reg.merge["id"], "namespace": NS, "name": "support-merged",
            "digest": reg.merge["digest"], "base": reg.merge["merged_base"]}
    for ref in (str(reg.merge["id"]), f"sha256:{reg.merge['digest']}"):  # idempotent
        r = _assign(reg.client, source, ref)
        assert r.status_code == 200, r.text
        assert r.json()["release"] == want and r.json()["base"] == reg.h_base
    assert _heartbeat(reg.client, source)["release_base"] == reg.merge["merged_base"]
    listed = reg.client.get("/v1/agents", params={"name": "source-0"}).json()
    assert [a["release"] for a in listed] == [want]  # what a starting agent reads

    # the restarted process serves the release: it may keep (or be given) the release
    serving = _reregister(reg.client, "source-0", source, str(reg.merge["merged_base"]))
    assert _heartbeat(reg.client, serving)["release_base"] == reg.merge["merged_base"]
    assert _assign(reg.client, serving, str(reg.merge["id"])).status_code == 200

    cleared = reg.client.delete(f"/v1/agents/{serving[0]}/release")
    assert cleared.status_code == 200 and cleared.json()["release"] is None
    assert _heartbeat(reg.client, serving)["release_base"] is None
    audit = reg.client.get("/v1/audit", params={"limit": 100}).json()["items"]
    actions = [e["action"] for e in audit if e["target"] == "agent:source-0"]
    assert actions.count("agent.assign") == 3 and actions.count("agent.unassign") == 1


def test_refusals_change_nothing(registry: Registry, merge_assets: MergeAssets) -> None:
    reg = registry
    source = register(reg.client, "source-1", reg.h_base)
    assert _assign(reg.client, source, str(reg.merge["id"])).status_code == 200

    agent_token = source[2]  # an agent may not place itself
    r = _assign(reg.client, source, str(reg.merge["id"]), headers=agent_token)
    assert (r.status_code, r.json()["code"]) == (403, "FORBIDDEN")
    r = reg.client.delete(f"/v1/agents/{source[0]}/release", headers=agent_token)
    assert r.status_code == 403
    r = _assign(reg.client, source, "999999")
    assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND")
    r = _assign(reg.client, source, str(reg.merge["id"]), namespace="nowhere")
    assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND")
    r = reg.client.post(f"/v1/agents/{source[0]}/release", json={"release": "1"})
    assert (r.status_code, r.json()["code"]) == (422, "VALIDATION_ERROR")
    r = reg.client.post("/v1/agents/999999/release", json={"namespace": NS, "release": "1"})
    assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND")

    inexact = submit_merge(reg.client, reg.h_base, merge_assets.base, reg.artifact["id"],
                     max_relative_error="0")
    assert inexact["state"] == "rejected", inexact
    r = _assign(reg.client, source, str(inexact["id"]))
    assert (r.status_code, r.json()["code"]) == (409, "INVALID_STATE")

    other_abi = read_base_abi(merge_assets.other_base).to_record()
    assert reg.client.post("/v1/bases", json={"name": "other", "abi": other_abi}).status_code == 201
    other = register(reg.client, "other-1", str(other_abi["h_base"]))
    r = _assign(reg.client, other, str(reg.merge["id"]))
    assert (r.status_code, r.json()["code"]) == (422, "BASE_MISMATCH")
    assert r.json()["detail"]["release_source_base"] == reg.h_base
    unknown = register(reg.client, "unknown-1", "0" * 64)
    r = _assign(reg.client, unknown, str(reg.merge["id"]))
    assert (r.status_code, r.json()["code"]) == (422, "BASE_MISMATCH")

    weights = next(name for name in reg.merge["files"] if name.endswith(".safetensors"))
    blob = next(p for p in reg.store_root.rglob("*")
                if p.is_file() and p.name == Path(reg.merge["files"][weights]["key"]).name)
    blob.write_bytes(b"\0" + blob.read_bytes()[1:])
    cleared = reg.client.delete(f"/v1/agents/{source[0]}/release")
    assert cleared.json()["release"] is None
    r = _assign(reg.client, source, str(reg.merge["id"]))
    assert (r.status_code, r.json()["code"]) == (409, "ARTIFACT_CORRUPT")
    for agent in (source, other, unknown):
        assert _assigned(reg.client, agent) is None
        assert _heartbeat(reg.client, agent)["release_base"] is None
