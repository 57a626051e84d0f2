"""Drain / undrain of an agent: `POST /v1/agents/{id}/drain|undrain` (admin on '*' or the
agent's own bound token; audited, idempotent), the heartbeat answer that carries the
flag, the agent's `drained` report and load, the state the control plane derives
(live / draining / drained / stale), a registration clearing the drain, the exact
`?name=` filter of the list, and placement moving a draining agent's adapters elsewhere.
On Postgres and on SQLite."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from cp_helpers import Api, Assets, setup_namespace
from test_cp_catalog_flows import publish, push_validated

from controlplane.contracts import AgentOut, DesiredState, HeartbeatOut
from controlplane.models import utcnow
from controlplane.models.agent import Agent


def _body(assets: Assets, name: str = "gpu-0", slots: int = 2) -> dict[str, Any]:
    return {"name": name, "url": "http://127.0.0.1:1",
            "capabilities": {"base": assets.h_base, "dtypes": ["float32"], "max_rank": 16,
                             "targets": ["q_proj", "v_proj"], "adapter_slots": slots,
                             "pool_pages": 100, "page_bytes": 4096, "kv_reserve_pages": 50,
                             "served_model_name": "tiny"}}


def _register(api: Api, who: dict[str, str], assets: Assets, name: str = "gpu-0",
              slots: int = 2) -> dict[str, Any]:
    r = api.client.post("/v1/agents/register", headers=who, json=_body(assets, name, slots))
    assert r.status_code == 201, r.text
    return dict(r.json())


def _beat(api: Api, who: dict[str, str], agent: dict[str, Any], **report: Any) -> HeartbeatOut:
    r = api.client.post(f"/v1/agents/{agent['id']}/heartbeat", headers=who,
                        json={"worker_epoch": agent["worker_epoch"], "catalog_version": 0,
                              **report})
    assert r.status_code == 200, r.text
    return HeartbeatOut.model_validate(r.json())


def _show(api: Api, agent: dict[str, Any]) -> AgentOut:
    r = api.client.get(f"/v1/agents/{agent['id']}", headers=api.admin)
    assert r.status_code == 200, r.text
    return AgentOut.model_validate(r.json())


def _drain(api: Api, who: dict[str, str], agent: dict[str, Any], verb: str = "drain") -> Any:
    return api.client.post(f"/v1/agents/{agent['id']}/{verb}", headers=who)


def _audit(api: Api) -> list[tuple[str, str]]:
    items = api.client.get("/v1/audit", headers=api.admin).json()["items"]
    return [(e["action"], e["target"]) for e in items
            if e["action"] in ("agent.drain", "agent.undrain")]


def test_drain_is_for_admins_and_the_agents_own_token(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    mine = api.token([], is_agent=True, name="agent-a")
    theirs = api.token([], is_agent=True, name="agent-b")
    reader = api.token([{"namespace": "*", "role": "read"}], name="reader")
    publisher = api.token([{"namespace": "*", "role": "publish"}], name="publisher")
    me = _register(api, mine, assets)
    _register(api, theirs, assets, "gpu-1")

    for who in (theirs, reader, publisher):
        for verb in ("drain", "undrain"):
            r = _drain(api, who, me, verb)
            assert r.status_code == 403, r.text
            assert r.json()["code"] == "FORBIDDEN"
    assert not _show(api, me).drain
    assert _audit(api) == []
    assert _drain(api, {}, me).status_code == 401
    assert api.client.post("/v1/agents/987654/drain", headers=api.admin).status_code == 404

    # the agent's own token (a preStop hook): drained twice, same answer (idempotent)
    for _ in range(2):
        r = _drain(api, mine, me)
        assert r.status_code == 200, r.text
        out = AgentOut.model_validate(r.json())
        assert (out.drain, out.drained, out.state) == (True, False, "draining")
    r = _drain(api, api.admin, me, "undrain")
    assert r.status_code == 200, r.text
    assert (r.json()["drain"], r.json()["state"]) == (False, "live")
    assert _drain(api, api.admin, me, "undrain").json()["drain"] is False
    assert _drain(api, api.admin, me).json()["state"] == "draining"
    assert _drain(api, mine, me, "undrain").json()["state"] == "live"
    audit = _audit(api)  # newest first
    assert audit == [("agent.undrain", "agent:gpu-0"), ("agent.drain", "agent:gpu-0"),
                     ("agent.undrain", "agent:gpu-0"), ("agent.undrain", "agent:gpu-0"),
                     ("agent.drain", "agent:gpu-0"), ("agent.drain", "agent:gpu-0")]


def test_heartbeat_carries_the_drain_and_the_agent_reports_drained(api: Api,
                                                                  assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    mine = api.token([], is_agent=True, name="agent-a")
    me = _register(api, mine, assets)
    assert _show(api, me).capabilities.served_model_name == "tiny"

    # drained means nothing while not draining
    answer = _beat(api, mine, me, live_requests=2, waiting_requests=1, free_pages=40,
                   pool_pages=100, drained=True)
    assert answer.drain is False
    shown = _show(api, me)
    assert (shown.state, shown.drain, shown.drained) == ("live", False, False)
    assert shown.load.model_dump() == {"live_requests": 2, "waiting_requests": 1,
                                       "free_pages": 40, "pool_pages": 100}

    assert _drain(api, api.admin, me).status_code == 200
    answer = _beat(api, mine, me, live_requests=1, free_pages=50, pool_pages=100)
    assert answer.drain is True
    assert _show(api, me).state == "draining"
    _beat(api, mine, me, free_pages=100, pool_pages=100, drained=True)
    shown = _show(api, me)
    assert (shown.state, shown.drain, shown.drained) == ("drained", True, True)
    assert shown.load.live_requests == 0 and shown.load.free_pages == 100
    # draining again keeps the drained report; the next heartbeat replaces it
    assert _drain(api, mine, me).json()["state"] == "drained"

    # undrain clears drained at once; the agent's stale drained report is ignored
    out = _drain(api, mine, me, "undrain").json()
    assert (out["drain"], out["drained"], out["state"]) == (False, False, "live")
    assert _beat(api, mine, me, drained=True).drain is False
    assert _show(api, me).drained is False

    # a new drain waits for a new drained report
    _drain(api, api.admin, me)
    _beat(api, mine, me, drained=True)
    assert _drain(api, api.admin, me, "undrain").json()["drained"] is False
    assert _drain(api, api.admin, me).json()["state"] == "draining"


def test_register_clears_the_drain(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    mine = api.token([], is_agent=True, name="agent-a")
    me = _register(api, mine, assets)
    _drain(api, mine, me)
    _beat(api, mine, me, live_requests=3, free_pages=9, pool_pages=100, drained=False)
    _beat(api, mine, me, drained=True)
    assert _show(api, me).state == "drained"

    again = _register(api, mine, assets)  # a new process of the agent
    assert again["worker_epoch"] == me["worker_epoch"] + 1
    assert (again["drain"], again["drained"], again["state"]) == (False, False, "live")
    assert again["load"] == {"live_requests": 0, "waiting_requests": 0, "free_pages": 0,
                             "pool_pages": 0}
    assert _beat(api, mine, again).drain is False


def test_a_silent_agent_is_stale_drained_or_not(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    mine = api.token([], is_agent=True, name="agent-a")
    me = _register(api, mine, assets)
    _drain(api, mine, me)
    _beat(api, mine, me, drained=True)
    with api.app.state.session_factory() as session:
        row = session.get(Agent, me["id"])
        assert row is not None
        row.last_heartbeat_at = utcnow() - timedelta(minutes=5)
        session.commit()
    shown = _show(api, me)
    assert (shown.state, shown.drain, shown.drained) == ("stale", True, True)
    listed = api.client.get("/v1/agents", headers=api.admin).json()
    assert [a["state"] for a in listed] == ["stale"]


def test_list_filters_by_exact_name(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    mine = api.token([], is_agent=True, name="agent-a")
    reader = api.token([{"namespace": "*", "role": "read"}], name="reader")
    narrow = api.token([{"namespace": "acme", "role": "read"}], name="narrow")
    for name in ("gpu-0", "gpu-01", "gpu-1"):
        _register(api, mine, assets, name)

    for who in (api.admin, reader, mine):  # global read (agent tokens have it)
        r = api.client.get("/v1/agents", headers=who, params={"name": "gpu-0"})
        assert r.status_code == 200, r.text
        assert [a["name"] for a in r.json()] == ["gpu-0"]
    assert api.client.get("/v1/agents", headers=api.admin,
                          params={"name": "gpu"}).json() == []
    assert api.client.get("/v1/agents", headers=api.admin,
                          params={"name": "GPU-0"}).json() == []
    every = api.client.get("/v1/agents", headers=api.admin).json()
    assert [a["name"] for a in every] == ["gpu-0", "gpu-01", "gpu-1"]
    assert api.client.get("/v1/agents", headers=narrow,
                          params={"name": "gpu-0"}).status_code == 403
    assert api.client.get("/v1/agents", headers=api.admin,
                          params={"name": "x" * 201}).status_code == 422


def _state(api: Api, who: dict[str, str], agent: dict[str, Any]) -> DesiredState:
    r = api.client.get(f"/v1/agents/{agent['id']}/desired-state", headers=who,
                       params={"worker_epoch": agent["worker_epoch"]})
    assert r.status_code == 200, r.text
    return DesiredState.model_validate(r.json())


def test_placement_moves_a_draining_agents_adapters_elsewhere(api: Api,
                                                              assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    a = push_validated(api, assets, assets.adapter_a)
    b = push_validated(api, assets, assets.adapter_b)  # rank 8: placed before a
    assert publish(api, "bot", a["id"]).status_code == 201
    assert publish(api, "other", b["id"]).status_code == 201
    t1 = api.token([], is_agent=True, name="agent-1")
    t2 = api.token([], is_agent=True, name="agent-2")
    one = _register(api, t1, assets, "agent-1", slots=1)
    two = _register(api, t2, assets, "agent-2", slots=1)
    assert (_state(api, t1, one).prefetch, _state(api, t2, two).prefetch) == (
        [b["digest"]], [a["digest"]])

    # draining, holding nothing yet: it prefetches nothing; the other agent takes b
    _drain(api, api.admin, one)
    assert _state(api, t1, one).prefetch == []
    assert _state(api, t2, two).prefetch == [b["digest"]]
    # what a draining agent holds it keeps (in-flight requests, a quick undrain)
    _beat(api, t1, one, slots=[{"artifact_digest": b["digest"], "state": "active",
                                "refcount": 1, "slot": 0}])
    assert _state(api, t1, one).prefetch == [b["digest"]]
    assert _state(api, t2, two).prefetch == [b["digest"]]

    _drain(api, api.admin, one, "undrain")
    assert (_state(api, t1, one).prefetch, _state(api, t2, two).prefetch) == (
        [b["digest"]], [a["digest"]])
