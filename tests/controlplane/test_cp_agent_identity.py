"""An agent name is bound to the token that registered it: another agent's token can
neither register over it (which would bump its epoch and fence the live agent), nor
heartbeat for it, nor read its desired state. Rotation (revoking the bound token) and
an admin's audited `unbind` release the name. On Postgres and on SQLite."""

from __future__ import annotations

from typing import Any

from cp_helpers import Api, Assets, setup_namespace


def _body(assets: Assets, name: str = "gpu-0") -> dict[str, Any]:
    return {"name": name, "url": "http://127.0.0.1:1",
            "capabilities": {"base": assets.h_base, "dtypes": ["float32"], "max_rank": 16,
                             "targets": ["q_proj", "v_proj"], "adapter_slots": 2,
                             "pool_pages": 100, "page_bytes": 4096, "kv_reserve_pages": 50}}


def _beat(api: Api, who: dict[str, str], agent: dict[str, Any]) -> int:
    r = api.client.post(f"/v1/agents/{agent['id']}/heartbeat", headers=who,
                        json={"worker_epoch": agent["worker_epoch"], "catalog_version": 0,
                              "slots": [], "load_failures": []})
    return r.status_code


def test_another_agent_token_cannot_take_over_a_name(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    mine = api.token([], is_agent=True, name="agent-a")
    theirs = api.token([], is_agent=True, name="agent-b")
    me = api.client.post("/v1/agents/register", headers=mine, json=_body(assets)).json()

    taken = api.client.post("/v1/agents/register", headers=theirs, json=_body(assets))
    assert taken.status_code == 409, taken.text
    assert taken.json()["code"] == "AGENT_NAME_BOUND"
    assert taken.json()["detail"] == {"name": "gpu-0", "state": "live"}
    shown = api.client.get(f"/v1/agents/{me['id']}", headers=api.admin).json()
    assert shown["worker_epoch"] == me["worker_epoch"]  # the live agent is not fenced

    assert _beat(api, theirs, me) == 403
    desired = api.client.get(f"/v1/agents/{me['id']}/desired-state", headers=theirs,
                             params={"worker_epoch": me["worker_epoch"]})
    assert desired.status_code == 403, desired.text
    assert _beat(api, mine, me) == 200
    ok = api.client.get(f"/v1/agents/{me['id']}/desired-state", headers=mine,
                        params={"worker_epoch": me["worker_epoch"]})
    assert ok.status_code == 200, ok.text

    # the bound token restarts its agent as before; one token may run several names
    again = api.client.post("/v1/agents/register", headers=mine, json=_body(assets))
    assert again.status_code == 201 and again.json()["worker_epoch"] == me["worker_epoch"] + 1
    other = api.client.post("/v1/agents/register", headers=theirs,
                            json=_body(assets, "gpu-1"))
    assert other.status_code == 201, other.text


def test_unbind_is_admin_only_and_audited(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    mine = api.token([], is_agent=True, name="agent-a")
    theirs = api.token([], is_agent=True, name="agent-b")
    me = api.client.post("/v1/agents/register", headers=mine, json=_body(assets)).json()
    assert api.client.post(f"/v1/agents/{me['id']}/unbind", headers=theirs).status_code == 403

    r = api.client.post(f"/v1/agents/{me['id']}/unbind", headers=api.admin)
    assert r.status_code == 200, r.text
    audit = api.client.get("/v1/audit", headers=api.admin).json()["items"]
    assert any(row["action"] == "agent.unbind" and row["target"] == "agent:gpu-0"
               for row in audit)
    moved = api.client.post("/v1/agents/register", headers=theirs, json=_body(assets))
    assert moved.status_code == 201 and moved.json()["worker_epoch"] == me["worker_epoch"] + 1
    # now bound to the new token: the old one is refused
    back = api.client.post("/v1/agents/register", headers=mine, json=_body(assets))
    assert back.status_code == 409 and back.json()["code"] == "AGENT_NAME_BOUND"


def test_revoking_the_bound_token_releases_the_name(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    old = api.client.post("/v1/tokens", headers=api.admin,
                          json={"name": "old", "grants": [], "is_agent": True}).json()
    new = api.token([], is_agent=True, name="new")
    old_auth = {"Authorization": f"Bearer {old['token']}"}
    assert api.client.post("/v1/agents/register", headers=old_auth,
                           json=_body(assets)).status_code == 201
    assert api.client.post("/v1/agents/register", headers=new,
                           json=_body(assets)).status_code == 409
    assert api.client.delete(f"/v1/tokens/{old['id']}", headers=api.admin).status_code in (
        200, 204)
    rotated = api.client.post("/v1/agents/register", headers=new, json=_body(assets))
    assert rotated.status_code == 201, rotated.text
