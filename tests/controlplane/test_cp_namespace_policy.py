"""Namespace tenant policy (scheduling weight and priority class): `PATCH
/v1/namespaces/{name}` (admin on '*', validated, audited, all-or-nothing), its place in
`NamespaceOut`, and its delivery to agents in desired state (`tenants`,
`tenants_version`), including waking a waiting long-poll. On Postgres and on SQLite."""

from __future__ import annotations

import time
from typing import Any

import pytest
from cp_helpers import Api, Assets, non_global_admins, poll_across, setup_namespace

from controlplane.contracts import Capabilities, DesiredState, RegisterRequest, TenantPolicy

PATH = "/v1/namespaces/acme"


def _namespaces(api: Api) -> dict[str, dict[str, Any]]:
    items = api.client.get("/v1/namespaces", headers=api.admin).json()["items"]
    return {n["name"]: n for n in items}


def _policy_audit(api: Api, ns: str = "acme") -> list[dict[str, Any]]:
    items = api.client.get(f"/v1/audit?namespace={ns}", headers=api.admin).json()["items"]
    return [e for e in items if e["action"] == "namespace.update"]


def _register(api: Api, assets: Assets, name: str = "tenant-agent") -> tuple[dict[str, str],
                                                                               int, int]:
    agent = api.token([], is_agent=True, name=name)
    caps = Capabilities(base=assets.h_base, dtypes=["float32"], max_rank=16,
                        targets=["q_proj", "v_proj"], adapter_slots=2, pool_pages=100,
                        page_bytes=4096, kv_reserve_pages=50)
    body = RegisterRequest(name=name, url="http://127.0.0.1:1", capabilities=caps)
    r = api.client.post("/v1/agents/register", headers=agent, json=body.model_dump(mode="json"))
    assert r.status_code == 201, r.text
    return agent, int(r.json()["id"]), int(r.json()["worker_epoch"])


def test_patch_sets_weight_and_priority_and_audits(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    created = _namespaces(api)["acme"]
    assert (created["weight"], created["priority"]) == (1.0, "normal")

    r = api.client.patch(PATH, headers=api.admin, json={"weight": 2.5})
    assert r.status_code == 200, r.text
    assert (r.json()["name"], r.json()["weight"], r.json()["priority"]) == ("acme", 2.5, "normal")
    r = api.client.patch(PATH, headers=api.admin, json={"priority": "high"})
    assert r.status_code == 200, r.text
    assert (r.json()["weight"], r.json()["priority"]) == (2.5, "high")  # weight kept
    r = api.client.patch(PATH, headers=api.admin, json={"weight": 1000, "priority": "low"})
    assert (r.json()["weight"], r.json()["priority"]) == (1000.0, "low")
    listed = _namespaces(api)["acme"]
    assert (listed["weight"], listed["priority"]) == (1000.0, "low")
    assert listed["id"] == created["id"] and listed["created_at"] == created["created_at"]

    rows = _policy_audit(api)  # newest first
    assert [e["detail"]["after"] for e in rows] == [
        {"weight": 1000.0, "priority": "low"}, {"weight": 2.5, "priority": "high"},
        {"weight": 2.5, "priority": "normal"}]
    assert rows[-1]["detail"]["before"] == {"weight": 1.0, "priority": "normal"}
    assert all(e["target"] == "namespace:acme" and e["actor"].startswith("token:")
               for e in rows)


INVALID: dict[str, Any] = {
    "zero": {"weight": 0},
    "negative": {"weight": -1.5},
    "above 1000": {"weight": 1000.001},
    "string weight": {"weight": "2"},
    "boolean weight": {"weight": True},
    "unknown priority": {"priority": "urgent"},
    "upper-case priority": {"priority": "HIGH"},
    "empty": {},
    "only nulls": {"weight": None, "priority": None},
    "unknown field": {"wieght": 2},
    "one bad of two": {"weight": 3, "priority": "critical"},
}


def test_invalid_policy_is_refused_and_changes_nothing(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    assert api.client.patch(PATH, headers=api.admin, json={"weight": 3}).status_code == 200
    before, audit_before = _namespaces(api)["acme"], _policy_audit(api)
    bodies: list[tuple[str, dict[str, Any]]] = [(k, {"json": v}) for k, v in INVALID.items()]
    # JSON has no NaN/Infinity, but Python's parser (the API's) accepts the literals
    for literal in ("NaN", "Infinity", "-Infinity"):
        bodies.append((literal, {"content": f'{{"weight": {literal}}}',
                                 "headers": {"Content-Type": "application/json"}}))
    for label, kw in bodies:
        headers = {**api.admin, **kw.pop("headers", {})}
        r = api.client.patch(PATH, headers=headers, **kw)
        assert r.status_code == 422, (label, r.text)
        body = r.json()
        assert body["code"] == "VALIDATION_ERROR", (label, body)
        assert body["error"].startswith("invalid request: "), (label, body)
        assert body["detail"]["errors"], (label, body)
    r = api.client.patch(PATH, headers=api.admin, json={"weight": 0})
    assert r.json()["error"] == "invalid request: weight: Input should be greater than 0"
    r = api.client.patch(PATH, headers=api.admin, json={"priority": "urgent"})
    assert "'high', 'normal' or 'low'" in r.json()["error"]
    assert _namespaces(api)["acme"] == before
    assert _policy_audit(api) == audit_before


def test_unknown_namespace_and_non_admins_are_refused(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    r = api.client.patch("/v1/namespaces/nowhere", headers=api.admin, json={"weight": 2})
    assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", r.text
    assert r.json()["detail"] == {"kind": "namespace", "ref": "nowhere"}

    tokens = non_global_admins(api)
    before = _namespaces(api)["acme"]
    for who, headers in tokens.items():
        for body in ({"weight": 9}, {"priority": "high"}):
            r = api.client.patch(PATH, headers=headers, json=body)
            assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN", (who, r.text)
        # refused before the lookup: an unknown name is not revealed either
        r = api.client.patch("/v1/namespaces/nowhere", headers=headers, json={"weight": 9})
        assert r.status_code == 403, (who, r.text)
    r = api.client.patch(PATH, json={"weight": 9})
    assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED"
    assert _namespaces(api)["acme"] == before
    assert _policy_audit(api) == []
    global_admin = api.token([{"namespace": "*", "role": "admin"}], name="ops")
    assert api.client.patch(PATH, headers=global_admin, json={"weight": 9}).status_code == 200
    (row,) = _policy_audit(api)
    assert row["actor"].endswith(":ops")


def test_desired_state_carries_every_tenant(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi, "acme")
    setup_namespace(api, assets.abi, "zeta")
    agent, agent_id, epoch = _register(api, assets)
    url, params = f"/v1/agents/{agent_id}/desired-state", {"worker_epoch": epoch}

    wire = api.client.get(url, headers=agent, params=params).json()
    state = DesiredState.model_validate(wire)
    assert state.model_dump(mode="json") == wire
    assert state.tenants == [TenantPolicy(namespace="acme", weight=1.0, priority="normal"),
                             TenantPolicy(namespace="zeta", weight=1.0, priority="normal")]
    assert state.tenants_version == 2  # one revision per namespace at creation

    assert api.client.patch("/v1/namespaces/zeta", headers=api.admin,
                            json={"weight": 4, "priority": "low"}).status_code == 200
    # an incremental state carries the complete list too, like `prefetch`
    delta = DesiredState.model_validate(api.client.get(
        url, headers=agent, params={**params, "since": state.version}).json())
    assert not delta.full and delta.aliases == []
    assert delta.version == state.version  # the catalog did not change ...
    assert delta.tenants_version == state.tenants_version + 1  # ... the policy did
    assert delta.tenants == [TenantPolicy(namespace="acme"),
                             TenantPolicy(namespace="zeta", weight=4.0, priority="low")]

    # setting the values it already has is audited but is no change for agents
    assert api.client.patch("/v1/namespaces/zeta", headers=api.admin,
                            json={"priority": "low"}).status_code == 200
    again = DesiredState.model_validate(api.client.get(url, headers=agent, params=params).json())
    assert again.tenants_version == delta.tenants_version and again.tenants == delta.tenants
    assert len(_policy_audit(api, "zeta")) == 2

    # a long-poll that only waits on the catalog does not return for a policy change,
    # one that names `tenants_after` returns at once when the policy is past it
    poll = {**params, "after": state.version, "wait": 0.3}
    assert api.client.get(url, headers=agent,
                          params={**poll, "tenants_after": state.tenants_version}
                          ).json()["tenants_version"] == delta.tenants_version
    started = time.monotonic()
    api.client.get(url, headers=agent, params={**poll, "tenants_after": delta.tenants_version})
    assert time.monotonic() - started >= 0.25  # nothing newer: it waited


def test_a_policy_change_wakes_a_waiting_agent(api: Api, assets: Assets) -> None:
    """The agent's own client long-polls (`tenants_after`) over real HTTP; a PATCH from
    another thread ends the poll long before its wait is up, with the new policy."""
    setup_namespace(api, assets.abi)
    agent, agent_id, epoch = _register(api, assets, "waiting-agent")

    def change() -> None:
        r = api.client.patch("/v1/namespaces/acme", headers=api.admin,
                             json={"weight": 7.5, "priority": "high"})
        assert r.status_code == 200, r.text

    first, answer, elapsed = poll_across(api, agent["Authorization"].split()[1], agent_id,
                                         epoch, change)
    assert elapsed < 15, elapsed  # woken by the change, not by the 30 s timeout
    assert answer.tenants_version > first.tenants_version and not answer.full
    assert answer.tenants == [TenantPolicy(namespace="acme", weight=7.5, priority="high")]


@pytest.mark.parametrize("weight", [1e-9, 0.5, 1, 999.999])
def test_weight_bounds_accepted(api: Api, assets: Assets, weight: float) -> None:
    setup_namespace(api, assets.abi)
    r = api.client.patch(PATH, headers=api.admin, json={"weight": weight})
    assert r.status_code == 200, r.text
    assert r.json()["weight"] == pytest.approx(weight)


def test_openapi_documents_the_patch(api: Api) -> None:
    doc = api.app.openapi()
    op = doc["paths"]["/v1/namespaces/{name}"]["patch"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schemas = doc["components"]["schemas"]
    body = schemas[ref.rsplit("/", 1)[1]]
    assert body["additionalProperties"] is False
    assert set(body["properties"]) == {"weight", "priority"}
    out = schemas["NamespaceOut"]
    assert {"weight", "priority"} <= set(out["required"])
    assert out["properties"]["priority"]["enum"] == ["high", "normal", "low"]
    assert set(schemas["TenantPolicy"]["required"]) == {"namespace", "weight", "priority"}
