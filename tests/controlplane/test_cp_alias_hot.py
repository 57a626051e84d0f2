"""Alias hot mark: `PATCH /v1/namespaces/{ns}/aliases/{alias}` (admin on '*', validated,
audited, all-or-nothing), its place in resolutions, and its effect on agents: the hot
alias's artifact is in `prefetch` of every compatible agent, and a change wakes a waiting
desired-state long-poll (`tenants_after`). On Postgres and on SQLite."""

from __future__ import annotations

from typing import Any

from cp_helpers import Api, Assets, non_global_admins, poll_across, setup_namespace
from test_cp_catalog_flows import publish, push_validated

from controlplane.contracts import Capabilities, DesiredState, RegisterRequest

ALIASES = "/v1/namespaces/acme/aliases"
BOT = f"{ALIASES}/bot"


def _hot_audit(api: Api) -> list[dict[str, Any]]:
    items = api.client.get("/v1/audit?namespace=acme", headers=api.admin).json()["items"]
    return [e for e in items if e["action"] == "alias.hot"]


def _resolution(api: Api) -> dict[str, Any]:
    r = api.client.get(BOT, headers=api.admin)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _listed(api: Api) -> dict[str, dict[str, Any]]:
    items = api.client.get(ALIASES, headers=api.admin).json()["items"]
    return {a["alias"]: a for a in items}


def _published(api: Api, assets: Assets) -> dict[str, Any]:
    setup_namespace(api, assets.abi)
    art = push_validated(api, assets, assets.adapter_a)
    r = publish(api, "bot", art["id"])
    assert r.status_code == 201, r.text
    assert "hot" not in r.json()  # a generation carries no mark
    return art


def _register(api: Api, assets: Assets, name: str, *, slots: int = 1,
              max_rank: int = 16) -> tuple[dict[str, str], int, int]:
    agent = api.token([], is_agent=True, name=name)
    caps = Capabilities(base=assets.h_base, dtypes=["float32"], max_rank=max_rank,
                        targets=["q_proj", "v_proj"], adapter_slots=slots, pool_pages=100,
                        page_bytes=4096, kv_reserve_pages=50)
    body = RegisterRequest(name=name, url="http://127.0.0.1:1", capabilities=caps)
    r = api.client.post("/v1/agents/register", headers=agent, json=body.model_dump(mode="json"))
    assert r.status_code == 201, r.text
    return agent, int(r.json()["id"]), int(r.json()["worker_epoch"])


def _state(api: Api, agent: tuple[dict[str, str], int, int]) -> DesiredState:
    headers, agent_id, epoch = agent
    r = api.client.get(f"/v1/agents/{agent_id}/desired-state", headers=headers,
                       params={"worker_epoch": epoch})
    assert r.status_code == 200, r.text
    return DesiredState.model_validate(r.json())


def _patch(api: Api, hot: bool, path: str = BOT) -> dict[str, Any]:
    r = api.client.patch(path, headers=api.admin, json={"hot": hot})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_patch_sets_and_clears_hot_and_audits(api: Api, assets: Assets) -> None:
    art = _published(api, assets)
    assert _resolution(api)["hot"] is False
    assert _listed(api)["bot"]["hot"] is False

    out = _patch(api, True)
    assert out == {**_resolution(api), "hot": True}
    assert (out["generation"], out["action"], out["artifact"]["id"], out["base"]) == (
        1, "publish", art["id"], assets.h_base)
    assert _listed(api)["bot"]["hot"] is True
    # a publish keeps the mark; its generation answer and history never show it
    b = push_validated(api, assets, assets.adapter_b)
    g2 = publish(api, "bot", b["id"])
    assert g2.status_code == 201 and "hot" not in g2.json()
    assert _resolution(api)["hot"] is True and _resolution(api)["generation"] == 2
    history = api.client.get(f"{BOT}/history", headers=api.admin).json()["items"]
    assert all("hot" not in g for g in history)

    assert _patch(api, False)["hot"] is False
    assert _resolution(api)["hot"] is False and _listed(api)["bot"]["hot"] is False

    rows = _hot_audit(api)  # newest first
    assert [e["detail"] for e in rows] == [{"before": True, "after": False},
                                           {"before": False, "after": True}]
    assert all(e["target"] == "alias:acme/bot" and e["namespace"] == "acme"
               and e["actor"].startswith("token:") for e in rows)


def test_a_retired_alias_keeps_and_takes_the_mark(api: Api, assets: Assets) -> None:
    _published(api, assets)
    assert api.client.post(f"{BOT}/retire", headers=api.admin, json={}).status_code == 201
    out = _patch(api, True)  # not 410: the mark is about the alias, not its generation
    assert (out["generation"], out["action"], out["artifact"], out["hot"]) == (
        2, "retire", None, True)
    assert api.client.get(BOT, headers=api.admin).json()["code"] == "ALIAS_RETIRED"
    assert _listed(api)["bot"]["hot"] is True
    rb = api.client.post(f"{BOT}/rollback", headers=api.admin, json={})
    assert rb.status_code == 201, rb.text
    assert _resolution(api)["hot"] is True and _resolution(api)["action"] == "rollback"


def test_non_admins_are_refused_and_change_nothing(api: Api, assets: Assets) -> None:
    _published(api, assets)
    tokens = non_global_admins(api)
    for who, headers in tokens.items():
        r = api.client.patch(BOT, headers=headers, json={"hot": True})
        assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN", (who, r.text)
        # refused before the lookup: an unknown alias is not revealed either
        r = api.client.patch(f"{ALIASES}/nowhere", headers=headers, json={"hot": True})
        assert r.status_code == 403, (who, r.text)
    r = api.client.patch(BOT, json={"hot": True})
    assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED"
    assert _resolution(api)["hot"] is False
    assert _hot_audit(api) == []
    ops = api.token([{"namespace": "*", "role": "admin"}], name="ops")
    assert api.client.patch(BOT, headers=ops, json={"hot": True}).json()["hot"] is True
    (row,) = _hot_audit(api)
    assert row["actor"].endswith(":ops")


def test_unknown_alias_or_namespace_is_404(api: Api, assets: Assets) -> None:
    _published(api, assets)
    r = api.client.patch(f"{ALIASES}/nowhere", headers=api.admin, json={"hot": True})
    assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", r.text
    assert r.json()["detail"] == {"namespace": "acme", "alias": "nowhere"}
    r = api.client.patch("/v1/namespaces/nowhere/aliases/bot", headers=api.admin,
                         json={"hot": True})
    assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", r.text
    assert r.json()["detail"] == {"kind": "namespace", "ref": "nowhere"}
    assert _hot_audit(api) == []


INVALID: dict[str, Any] = {
    "missing hot": {},
    "string": {"hot": "yes"},
    "string true": {"hot": "true"},
    "integer": {"hot": 1},
    "null": {"hot": None},
    "extra field": {"hot": True, "weight": 2},
    "unknown field only": {"hott": True},
}


def test_invalid_body_is_refused_and_changes_nothing(api: Api, assets: Assets) -> None:
    _published(api, assets)
    agent = _register(api, assets, "hot-agent")
    before, version = _resolution(api), _state(api, agent).tenants_version
    for label, body in INVALID.items():
        r = api.client.patch(BOT, headers=api.admin, json=body)
        assert r.status_code == 422, (label, r.text)
        assert r.json()["code"] == "VALIDATION_ERROR", (label, r.text)
        assert r.json()["error"].startswith("invalid request: "), (label, r.text)
        assert r.json()["detail"]["errors"], (label, r.text)
    assert _resolution(api) == before
    assert _hot_audit(api) == []
    assert _state(api, agent).tenants_version == version


def test_tenants_version_grows_only_on_a_real_change(api: Api, assets: Assets) -> None:
    _published(api, assets)
    agent = _register(api, assets, "hot-agent")
    first = _state(api, agent)
    assert first.tenants_version == 1  # one namespace, revision 1
    assert [a.hot for a in first.aliases] == [False]

    _patch(api, True)
    marked = _state(api, agent)
    assert marked.tenants_version == first.tenants_version + 1
    assert marked.version == first.version  # no new generation
    assert [a.hot for a in marked.aliases] == [True]
    _patch(api, True)  # the value it has: audited, no change for agents
    assert _state(api, agent).tenants_version == marked.tenants_version
    _patch(api, False)
    assert _state(api, agent).tenants_version == marked.tenants_version + 1
    assert len(_hot_audit(api)) == 3
    # the namespace's own policy is untouched
    (ns,) = [n for n in api.client.get("/v1/namespaces", headers=api.admin).json()["items"]
             if n["name"] == "acme"]
    assert (ns["weight"], ns["priority"]) == (1.0, "normal")


def test_a_hot_alias_is_prefetched_on_every_compatible_agent(api: Api,
                                                             assets: Assets) -> None:
    art = _published(api, assets)  # "bot" -> adapter a (rank 4)
    b = push_validated(api, assets, assets.adapter_b)  # rank 8: heavier than a
    assert publish(api, "other", b["id"]).status_code == 201
    # one adapter slot each; the third agent's max rank (2) fits neither adapter
    one = _register(api, assets, "agent-1")
    two = _register(api, assets, "agent-2")
    low = _register(api, assets, "agent-low-rank", slots=4, max_rank=2)
    a_digest, b_digest = art["digest"], b["digest"]

    # cold: heaviest first, so b takes agent 1 (tie on room: the lower id), a agent 2
    assert _state(api, one).prefetch == [b_digest]
    assert _state(api, two).prefetch == [a_digest]
    assert _state(api, low).prefetch == []

    _patch(api, True)
    # hot: a is placed first, on both compatible agents; b no longer fits anywhere
    for agent in (one, two):
        state = _state(api, agent)
        assert state.prefetch == [a_digest], agent[1]
        flags = {a.alias: (a.prefetch, a.hot) for a in state.aliases}
        assert flags == {"bot": (True, True), "other": (False, False)}
    assert _state(api, low).prefetch == []

    _patch(api, False)
    assert (_state(api, one).prefetch, _state(api, two).prefetch) == ([b_digest], [a_digest])


def test_a_hot_mark_wakes_a_waiting_agent(api: Api, assets: Assets) -> None:
    """The agent's own client long-polls (`tenants_after`) over real HTTP; a PATCH from
    another thread ends the poll long before its wait is up, with the new prefetch."""
    art = _published(api, assets)
    _register(api, assets, "first-agent")  # holds "bot" by placement while it is cold
    headers, agent_id, epoch = _register(api, assets, "waiting-agent")
    first, answer, elapsed = poll_across(api, headers["Authorization"].split()[1], agent_id,
                                         epoch, lambda: _patch(api, True))
    assert first.prefetch == []
    assert elapsed < 15, elapsed  # woken by the change, not by the 30 s timeout
    assert answer.tenants_version > first.tenants_version and not answer.full
    assert answer.version == first.version and answer.aliases == []
    assert answer.prefetch == [art["digest"]]


def test_openapi_documents_the_patch(api: Api) -> None:
    doc = api.app.openapi()
    op = doc["paths"]["/v1/namespaces/{namespace}/aliases/{alias}"]["patch"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ResolutionOut")
    schemas = doc["components"]["schemas"]
    body = schemas[ref.rsplit("/", 1)[1]]
    assert body["additionalProperties"] is False
    assert body["required"] == ["hot"] and body["properties"]["hot"]["type"] == "boolean"
    assert "hot" in schemas["ResolutionOut"]["properties"]
    assert "hot" not in schemas["GenerationOut"]["properties"]
    assert "hot" in schemas["DesiredAlias"]["properties"]
