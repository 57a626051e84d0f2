"""`GET /v1/fleet/routing`: what routers replicate. Who may read it, the aliases it
lists (current generation, digest, shape; null when retired; omitted when the caller is
current), the agents (load, drain, residency) and that its placement is the one the
agents' desired states prefetch. On Postgres and on SQLite."""

from __future__ import annotations

from typing import Any

from cp_helpers import Api, Assets, setup_namespace
from test_cp_catalog_flows import publish, push_validated

from controlplane.contracts import DesiredState, RoutingState


def _register(api: Api, who: dict[str, str], assets: Assets, name: str,
              slots: int = 1) -> dict[str, Any]:
    r = api.client.post("/v1/agents/register", headers=who, json={
        "name": name, "url": f"http://{name}.invalid:8500",
        "capabilities": {"base": assets.h_base, "dtypes": ["float32"], "max_rank": 16,
                         "targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
                         "adapter_slots": slots, "pool_pages": 100, "page_bytes": 4096,
                         "kv_reserve_pages": 10, "served_model_name": "tiny"}})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _routing(api: Api, who: dict[str, str] | None = None, **params: Any) -> RoutingState:
    r = api.client.get("/v1/fleet/routing", headers=who or api.admin, params=params)
    assert r.status_code == 200, r.text
    return RoutingState.model_validate(r.json())


def _beat(api: Api, who: dict[str, str], agent: dict[str, Any], **report: Any) -> None:
    r = api.client.post(f"/v1/agents/{agent['id']}/heartbeat", headers=who,
                        json={"worker_epoch": agent["worker_epoch"], "catalog_version": 0,
                              **report})
    assert r.status_code == 200, r.text


def test_only_fleet_wide_readers_see_the_routing_state(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    assert api.client.get("/v1/fleet/routing").status_code == 401
    ns_reader = api.token([{"namespace": "acme", "role": "read"}], name="r")
    r = api.client.get("/v1/fleet/routing", headers=ns_reader)
    assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
    for who in (api.token([{"namespace": "*", "role": "read"}], name="router"),
                api.token([], is_agent=True, name="agent")):
        assert _routing(api, who).aliases == []


def test_aliases_are_the_current_generations(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    a = push_validated(api, assets, assets.adapter_a)
    b = push_validated(api, assets, assets.adapter_b)
    assert publish(api, "one", a["id"]).status_code == 201
    assert publish(api, "two", a["id"]).status_code == 201
    assert publish(api, "two", b["id"]).status_code == 201
    state = _routing(api)
    got = {(x.namespace, x.alias): x for x in state.aliases or []}
    assert set(got) == {("acme", "one"), ("acme", "two")}
    assert (got["acme", "one"].current_generation, got["acme", "one"].digest) == (1, a["digest"])
    assert (got["acme", "two"].current_generation, got["acme", "two"].digest) == (2, b["digest"])
    two = got["acme", "two"]
    record = api.client.get(f"/v1/namespaces/acme/artifacts/{b['id']}",
                            headers=api.admin).json()["validated_record"]
    assert two.base == assets.h_base
    assert two.rank == max(m["rank"] for m in record["modules"])
    assert set(two.roles) == {m["role"] for m in record["modules"]}
    # a caller that is current gets agents only; a retire moves the version on
    assert _routing(api, since=state.version).aliases is None
    r = api.client.post("/v1/namespaces/acme/aliases/one/retire", headers=api.admin, json={})
    assert r.status_code == 201, r.text
    later = _routing(api, since=state.version, wait=5)
    assert later.version > state.version
    retired = {x.alias: x for x in later.aliases or []}["one"]
    assert retired.digest is None and retired.current_generation == 2


def test_agents_carry_load_drain_and_residency(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    token = api.token([], is_agent=True, name="agent")
    one = _register(api, token, assets, "gpu-0")
    two = _register(api, token, assets, "gpu-1")
    _beat(api, token, one, live_requests=3, waiting_requests=2, free_pages=40,
          pool_pages=100, slots=[{"artifact_digest": "f" * 64, "state": "loading"},
                                 {"artifact_digest": "e" * 64, "state": "active"}])
    assert api.client.post(f"/v1/agents/{two['id']}/drain", headers=api.admin).status_code == 200
    agents = {a.name: a for a in _routing(api).agents}
    assert agents["gpu-0"].load.live_requests == 3
    assert agents["gpu-0"].load.waiting_requests == 2
    assert agents["gpu-0"].load.free_pages == 40
    assert agents["gpu-0"].resident == ["e" * 64]
    assert agents["gpu-0"].arriving == ["f" * 64]  # loading: on its way
    assert agents["gpu-0"].url == "http://gpu-0.invalid:8500"
    assert agents["gpu-0"].served_model_name == "tiny"
    assert not agents["gpu-0"].drain and agents["gpu-1"].drain
    assert 0 <= agents["gpu-0"].heartbeat_age_s < 30


def test_routing_residency_includes_exactly_what_placement_prefetches(
        api: Api, assets: Assets) -> None:
    """Routers send an adapter where the agents' own desired states put it: for every
    agent, the digests its desired state prefetches are resident in the routing state,
    and no agent is said to hold a published adapter it neither holds nor prefetches."""
    setup_namespace(api, assets.abi)
    token = api.token([], is_agent=True, name="agent")
    agents = [_register(api, token, assets, f"gpu-{i}") for i in range(3)]
    a = push_validated(api, assets, assets.adapter_a)
    b = push_validated(api, assets, assets.adapter_b)
    assert publish(api, "one", a["id"]).status_code == 201
    # gpu-1 is loading `a` already (a request sent it there); placement keeps it there
    _beat(api, token, agents[1], slots=[{"artifact_digest": a["digest"], "state": "loading"}])
    assert publish(api, "two", b["id"]).status_code == 201
    routing = {x.id: set(x.resident) | set(x.arriving) for x in _routing(api).agents}
    placed: dict[int, set[str]] = {}
    for agent in agents:
        r = api.client.get(f"/v1/agents/{agent['id']}/desired-state", headers=token,
                           params={"worker_epoch": agent["worker_epoch"]})
        assert r.status_code == 200, r.text
        placed[agent["id"]] = set(DesiredState.model_validate(r.json()).prefetch)
    assert placed == routing, (placed, routing)
    assert a["digest"] in placed[agents[1]["id"]]  # a load under way is not moved
    assert sum(a["digest"] in p for p in placed.values()) == 1
    assert sum(b["digest"] in p for p in placed.values()) == 1


def test_a_hot_adapter_gets_replicas_from_reported_rates(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    token = api.token([], is_agent=True, name="agent")
    agents = [_register(api, token, assets, f"gpu-{i}", slots=2) for i in range(3)]
    a = push_validated(api, assets, assets.adapter_a)
    b = push_validated(api, assets, assets.adapter_b)
    assert publish(api, "hot", a["id"]).status_code == 201
    assert publish(api, "cool", b["id"]).status_code == 201

    def prefetched() -> dict[str, set[str]]:
        out = {}
        for agent in agents:
            r = api.client.get(f"/v1/agents/{agent['id']}/desired-state", headers=token,
                               params={"worker_epoch": agent["worker_epoch"]})
            out[agent["name"]] = set(DesiredState.model_validate(r.json()).prefetch)
        return out

    def copies(digest: str) -> int:
        return sum(digest in p for p in prefetched().values())

    assert copies(a["digest"]) == 1 and copies(b["digest"]) == 1
    # gpu-0 serves `hot` at 30 req/s and `cool` at 3: `hot` draws 30 of 33 req/s over 3
    # agents, ceil(30 x 3 / 33) = 3 copies (and 30 req/s is worth ceil(30 / 4) >= 3);
    # `cool` ceil(3 x 3 / 33) = 1
    _beat(api, token, agents[0], slots=[
        {"artifact_digest": a["digest"], "state": "active", "rate": 30.0},
        {"artifact_digest": b["digest"], "state": "idle", "rate": 3.0}])
    assert copies(a["digest"]) == 3 and copies(b["digest"]) == 1
    routing = {x.name: set(x.resident) | set(x.arriving) for x in _routing(api).agents}
    assert all(a["digest"] in routing[f"gpu-{i}"] for i in range(3))
    # the rate falls to 1 req/s each: half the traffic would be 2 copies by share, but
    # 1 req/s is below one copy's worth (4 req/s): one copy again, the held one on gpu-0
    _beat(api, token, agents[0], slots=[
        {"artifact_digest": a["digest"], "state": "active", "rate": 1.0},
        {"artifact_digest": b["digest"], "state": "idle", "rate": 1.0}])
    assert prefetched()["gpu-0"] >= {a["digest"]} and copies(a["digest"]) == 1
