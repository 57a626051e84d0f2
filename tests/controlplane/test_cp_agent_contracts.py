"""The agent wire contracts (controlplane/contracts.py) against the real API: they are in
the OpenAPI document, real answers validate into them and dump back to the same JSON, and
the agent's own client speaks them over HTTP. On Postgres and on SQLite."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from cp_helpers import Api, Assets, LiveServer, setup_namespace
from test_cp_catalog_flows import publish, push_validated

from controlplane.contracts import (
    AgentOut,
    Capabilities,
    DesiredState,
    HeartbeatOut,
    HeartbeatRequest,
    RegisterRequest,
    SlotReport,
)

REF = "#/components/schemas/"


def _caps(assets: Assets) -> Capabilities:
    return Capabilities(base=assets.h_base, dtypes=["float32"], max_rank=16,
                        targets=["q_proj", "v_proj"], adapter_slots=2, pool_pages=100,
                        page_bytes=4096, kv_reserve_pages=50)


def _schema_ref(content: dict[str, Any]) -> str:
    return str(content["application/json"]["schema"]["$ref"]).removeprefix(REF)


def test_openapi_declares_the_agent_contracts(api: Api) -> None:
    doc = api.app.openapi()
    paths, schemas = doc["paths"], doc["components"]["schemas"]
    register = paths["/v1/agents/register"]["post"]
    assert _schema_ref(register["requestBody"]["content"]) == "RegisterRequest"
    assert _schema_ref(register["responses"]["201"]["content"]) == "AgentOut"
    beat = paths["/v1/agents/{agent_id}/heartbeat"]["post"]
    assert _schema_ref(beat["requestBody"]["content"]) == "HeartbeatRequest"
    assert _schema_ref(beat["responses"]["200"]["content"]) == "HeartbeatOut"
    desired = paths["/v1/agents/{agent_id}/desired-state"]["get"]
    assert _schema_ref(desired["responses"]["200"]["content"]) == "DesiredState"
    for name in ("RegisterRequest", "Capabilities", "HeartbeatRequest", "SlotReport",
                 "LoadFailureReport", "AgentOut", "DesiredState", "DesiredAlias",
                 "DesiredGeneration", "DesiredArtifact", "DesiredFile", "DesiredCollection",
                 "TenantPolicy", "DesiredRelease", "BaseCheckpoint"):
        assert name in schemas, name
    # everything this control plane always sends is required in its answers' schemas
    assert set(schemas["DesiredState"]["required"]) == {
        "version", "agent_id", "worker_epoch", "full", "since", "url_ttl_s", "prefetch",
        "tenants_version", "tenants", "aliases"}
    assert set(schemas["TenantPolicy"]["required"]) == {"namespace", "weight", "priority"}
    assert set(schemas["DesiredAlias"]["required"]) == {
        "namespace", "alias", "base", "current_generation", "generations", "prefetch", "hot"}
    assert "release" in schemas["DesiredGeneration"]["properties"]  # sent only for releases
    artifact = schemas["DesiredArtifact"]
    assert set(artifact["required"]) == {"id", "digest", "files", "validated_record"}
    assert "collection" in artifact["properties"]  # sent only for collection members
    assert set(schemas["RegisterRequest"]["required"]) == {"name", "url", "capabilities"}
    assert set(schemas["HeartbeatRequest"]["required"]) == {"worker_epoch", "catalog_version"}


def test_real_answers_validate_into_the_contracts(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    art = push_validated(api, assets, assets.adapter_a)
    assert publish(api, "bot", art["id"]).status_code in (200, 201)
    agent = api.token([], is_agent=True, name="contracts-agent")
    body = RegisterRequest(name="contracts-agent", url="http://127.0.0.1:1",
                           capabilities=_caps(assets))
    r = api.client.post("/v1/agents/register", headers=agent, json=body.model_dump(mode="json"))
    assert r.status_code == 201, r.text
    me = AgentOut.model_validate(r.json())
    assert me.capabilities == body.capabilities and me.worker_epoch == 1

    report = HeartbeatRequest(worker_epoch=me.worker_epoch, catalog_version=1,
                              slots=[SlotReport(artifact_digest=art["digest"], state="idle")])
    r = api.client.post(f"/v1/agents/{me.id}/heartbeat", headers=agent,
                        json=report.model_dump(mode="json"))
    assert r.status_code == 200, r.text
    HeartbeatOut.model_validate(r.json())
    shown = AgentOut.model_validate(
        api.client.get(f"/v1/agents/{me.id}", headers=api.admin).json())
    assert shown.slots == report.slots

    url, params = f"/v1/agents/{me.id}/desired-state", {"worker_epoch": me.worker_epoch}
    wire = api.client.get(url, headers=agent, params=params).json()
    state = DesiredState.model_validate(wire)
    assert state.model_dump(mode="json") == wire  # the model is the whole wire format
    assert state.full and state.since is None and state.agent_id == me.id
    (alias,) = [a for a in state.aliases if (a.namespace, a.alias) == ("acme", "bot")]
    (gen,) = alias.generations
    assert gen.artifact is not None and gen.artifact.digest == art["digest"]
    assert gen.artifact.collection is None and "collection" not in \
        wire["aliases"][0]["generations"][0]["artifact"]
    assert set(gen.artifact.files) == {"adapter_config.json", "adapter_model.safetensors"}

    delta_wire = api.client.get(url, headers=agent,
                                params={**params, "since": state.version}).json()
    delta = DesiredState.model_validate(delta_wire)
    assert delta.model_dump(mode="json") == delta_wire
    assert (delta.full, delta.since, delta.aliases) == (False, state.version, [])


def test_the_agent_client_speaks_the_contracts(api: Api, assets: Assets) -> None:
    """agent/sync.py's client against the API over HTTP: typed answers, and the catalog
    replica built from them by attribute."""
    from agent.catalog import AgentCatalog, ModelRef, parse_desired_state
    from agent.sync import ControlPlaneClient

    setup_namespace(api, assets.abi)
    art = push_validated(api, assets, assets.adapter_b)
    assert publish(api, "typed", art["id"]).status_code in (200, 201)
    token = api.token([], is_agent=True, name="typed-agent")["Authorization"].split()[1]
    with LiveServer(api.app) as server:
        client = ControlPlaneClient(server.url, token)
        try:
            me = client.register(RegisterRequest(name="typed-agent", url="http://127.0.0.1:1",
                                                 capabilities=_caps(assets)))
            assert isinstance(me, AgentOut) and me.name == "typed-agent"
            beat = client.heartbeat(me.id, HeartbeatRequest(worker_epoch=me.worker_epoch,
                                                            catalog_version=0))
            assert isinstance(beat, HeartbeatOut) and beat.worker_epoch == me.worker_epoch
            state = client.desired_state(me.id, me.worker_epoch, after=-1, wait_s=0)
        finally:
            client.close()
    assert isinstance(state, DesiredState)
    catalog = AgentCatalog()
    catalog.update(*parse_desired_state(state))
    resolved = catalog.resolve(ModelRef("acme", "typed"))
    assert resolved.artifact is not None and resolved.artifact.digest == art["digest"]


@pytest.mark.parametrize("module", ["controlplane.contracts", "agent.sync"])
def test_the_contracts_import_no_control_plane_runtime(module: str) -> None:
    """An agent importing the contracts loads neither the DB layer nor the web app."""
    code = (f"import sys, {module}\n"
            "heavy = ('sqlalchemy', 'fastapi', 'starlette', 'celery', 'alembic', 'boto3')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy\n"
            "             or m.startswith('controlplane.') and m != 'controlplane.contracts'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
