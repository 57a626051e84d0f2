"""The control plane's agent routes over real HTTP: registration epochs, fencing of
stale processes, slot reports, long-poll wake-up on publish, token authorization."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from .conftest import Deployment


def caps(deployment: Deployment) -> dict[str, Any]:
    return {"base": deployment.h_base, "dtypes": ["float32"], "max_rank": 8,
            "targets": ["q_proj", "v_proj"], "adapter_slots": 2, "pool_pages": 100,
            "page_bytes": 4096, "kv_reserve_pages": 50}


def http(deployment: Deployment, token: str) -> httpx.Client:
    return httpx.Client(base_url=deployment.cp.url, timeout=60.0,
                        headers={"Authorization": f"Bearer {token}"})


def test_registration_epochs_and_stale_heartbeat(deployment: Deployment) -> None:
    agent = http(deployment, deployment.agent_token)
    body = {"name": "probe-agent", "url": "http://127.0.0.1:1", "capabilities": caps(deployment)}
    first = agent.post("/v1/agents/register", json=body).json()
    second = agent.post("/v1/agents/register", json=body).json()
    assert second["id"] == first["id"]
    assert second["worker_epoch"] == first["worker_epoch"] + 1
    stale = agent.post(f"/v1/agents/{first['id']}/heartbeat",
                       json={"worker_epoch": first["worker_epoch"], "catalog_version": 0})
    assert stale.status_code == 409 and stale.json()["code"] == "STALE_EPOCH"
    report = {"worker_epoch": second["worker_epoch"], "catalog_version": 3,
              "slots": [{"artifact_digest": "ab" * 32, "state": "idle", "refcount": 0}]}
    ok = agent.post(f"/v1/agents/{first['id']}/heartbeat", json=report)
    assert ok.status_code == 200, ok.text
    shown = agent.get(f"/v1/agents/{first['id']}").json()
    assert shown["slots"][0]["artifact_digest"] == "ab" * 32
    assert shown["catalog_version"] == 3
    stale_poll = agent.get(f"/v1/agents/{first['id']}/desired-state",
                           params={"worker_epoch": first["worker_epoch"]})
    assert stale_poll.status_code == 409


def test_only_agent_or_admin_tokens_register(deployment: Deployment) -> None:
    body = {"name": "intruder", "url": "http://x", "capabilities": caps(deployment)}
    refused = http(deployment, deployment.reader_token).post("/v1/agents/register", json=body)
    assert refused.status_code == 403
    bad = http(deployment, deployment.agent_token).post(
        "/v1/agents/register", json={**body, "capabilities": {"base": "zz"}})
    assert bad.status_code == 422


def test_long_poll_wakes_on_publish_and_reports_the_new_generation(
        deployment: Deployment) -> None:
    agent = http(deployment, deployment.agent_token)
    me = agent.post("/v1/agents/register", json={
        "name": "poller", "url": "http://127.0.0.1:1", "capabilities": caps(deployment)}).json()
    params = {"worker_epoch": me["worker_epoch"]}
    now = agent.get(f"/v1/agents/{me['id']}/desired-state", params=params).json()
    got: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: got.append(agent.get(
        f"/v1/agents/{me['id']}/desired-state",
        params={**params, "after": now["version"], "wait": 30}).json()))
    waiter.start()
    ns = deployment.namespace
    deployment.admin.publish(ns, "polled", deployment.artifacts["c"]["id"])
    waiter.join(timeout=40)
    assert got and got[0]["version"] > now["version"]
    polled = [a for a in got[0]["aliases"] if a["namespace"] == ns and a["alias"] == "polled"]
    assert polled and polled[0]["current_generation"] == 1
    art = polled[0]["generations"][0]["artifact"]
    assert art["digest"] == deployment.artifacts["c"]["digest"]
    assert set(art["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert all(f["url"].startswith("http") for f in art["files"].values())  # presigned S3


def test_authorize_checks_the_callers_read_scope(deployment: Deployment) -> None:
    ns = deployment.namespace
    ok = http(deployment, deployment.reader_token).get("/v1/agents/authorize",
                                                       params={"namespace": ns})
    assert ok.status_code == 200 and ok.json()["role"] == "read"
    no = http(deployment, deployment.outsider_token).get("/v1/agents/authorize",
                                                         params={"namespace": ns})
    assert no.status_code == 403
    bad = http(deployment, "ap_not-a-token").get("/v1/agents/authorize",
                                                 params={"namespace": ns})
    assert bad.status_code == 401


def test_serving_agent_reports_its_slots(deployment: Deployment) -> None:
    admin = http(deployment, deployment.cp.token())
    deployment.agent.wait_for(lambda s: any(x["state"] in ("active", "idle")
                                            for x in s["slots"]))

    def reported() -> bool:
        agents = {a["name"]: a for a in admin.get("/v1/agents").json()}
        return any(s["state"] in ("active", "idle") for s in agents["agent-0"]["slots"])

    deployment.agent.wait_for(lambda _s: reported())
    # each bound slot records its H_kernel_local: the adapter whole on one device, in the
    # unified page pool ("paged"), read by the torch kernels (CPU, float32; `lora_fold=auto`
    # keeps the launches on the CPU)
    from dataplane.identity import activation_policy_sha256, digest, h_adapter_semantic

    by_digest = {a["digest"]: a for a in deployment.artifacts.values()}
    bound = [x for x in deployment.agent.state()["slots"] if x["slot"] is not None]
    assert bound
    for slot in bound:
        artifact = by_digest[slot["artifact_digest"]]
        record = artifact["validated_record"]
        names = sorted(m["name"] for m in record["modules"])
        policy = activation_policy_sha256(record.get("alora_invocation_tokens"))
        assert slot["kernel_local"] == [digest({
            "h_adapter_semantic": h_adapter_semantic(deployment.h_base, artifact["digest"],
                                                     policy),
            "kernel_family": "torch", "conversion_revision": 1, "dtype": "float32",
            "packing": "paged",
            "local_module_layouts": [{"name": n, "a_axes": ["rank", "input"],
                                      "b_axes": ["rank", "output"], "a_shard": None,
                                      "b_shard": None} for n in names],
            "parallel_shard": {"tp_rank": 0, "tp_size": 1}})]


def test_desired_state_is_incremental_since_a_version(deployment: Deployment) -> None:
    """`since=V` sends only aliases changed after V (plus the full prefetch list); a full
    state and the merge of incremental ones describe the same catalog."""
    from agent.catalog import AgentCatalog, parse_desired_state

    agent = http(deployment, deployment.agent_token)
    me = agent.post("/v1/agents/register", json={
        "name": "incremental", "url": "http://127.0.0.1:1",
        "capabilities": caps(deployment)}).json()
    url, params = f"/v1/agents/{me['id']}/desired-state", {"worker_epoch": me["worker_epoch"]}
    full = agent.get(url, params=params).json()
    assert full["full"] is True and full["aliases"] and full["url_ttl_s"] > 0
    replica = AgentCatalog()
    replica.update(*parse_desired_state(full))
    quiet = agent.get(url, params={**params, "since": full["version"]}).json()
    assert quiet["full"] is False and quiet["aliases"] == []
    assert quiet["version"] == full["version"] and isinstance(quiet["prefetch"], list)
    ns = deployment.namespace
    deployment.admin.publish(ns, "incr", deployment.artifacts["a"]["id"])
    deployment.admin.publish(ns, "incr", deployment.artifacts["c"]["id"])
    delta = agent.get(url, params={**params, "since": full["version"]}).json()
    assert [(a["namespace"], a["alias"]) for a in delta["aliases"]] == [(ns, "incr")]
    assert delta["aliases"][0]["current_generation"] == 2
    replica.merge(*parse_desired_state(delta), set(delta["prefetch"]))
    fresh = AgentCatalog()
    fresh.update(*parse_desired_state(agent.get(url, params=params).json()))
    assert replica.version == fresh.version > full["version"]
    assert sorted((g.name, g.generation, g.artifact.digest if g.artifact else None)
                  for g in replica.current()) == sorted(
        (g.name, g.generation, g.artifact.digest if g.artifact else None)
        for g in fresh.current())
    assert {a.digest for a in replica.prefetch_targets()} == \
        set(delta["prefetch"]) & replica.named_digests()
