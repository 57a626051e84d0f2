"""The agent's event spine through a real agent process: one completed request moves each
of its events once, prefetched adapters that serve a request count as used, and the
bounded top-k endpoint names the tenants that `/metrics` never labels."""

from __future__ import annotations

import httpx

from .conftest import Deployment
from .test_inference_api import complete


def _events(dep: Deployment) -> dict:
    return dep.agent.state()["events"]


def test_one_request_moves_each_event_once(deployment: Deployment) -> None:
    ns = deployment.namespace
    complete(deployment, f"{ns}/a", [3, 4, 5])  # warm: placement prefetched it
    before = _events(deployment)
    complete(deployment, f"{ns}/a", [6, 7, 8])
    after = deployment.agent.wait_for(
        lambda s: s["events"]["events"]["completed_service_debited"]
        > before["events"]["completed_service_debited"])["events"]
    delta = {k: after["events"][k] - before["events"][k] for k in before["events"]}
    assert delta["queue_enqueued"] == 1
    assert delta["iteration_selected"] == 1
    assert delta["iteration_completed"] == 1
    assert delta["completed_service_debited"] == 1
    assert delta["adapter_load_started"] == 0  # a hit loads nothing
    assert after["lookups"]["hit"] == before["lookups"]["hit"] + 1
    assert after["cache_hit_rate"] is not None and after["cache_hit_rate"] > 0
    # placement prefetched the working set; a request used one of those generations
    assert after["events"]["prefetch_reserved"] >= 1
    assert after["prefetch_precision"] is not None and after["prefetch_precision"] > 0
    assert after["load_amplification"] is not None and after["load_amplification"] >= 1
    assert after["adapter_class_service"]["resident"] > 0


def test_top_k_names_tenants_and_adapters_within_k(deployment: Deployment) -> None:
    ns = deployment.namespace
    complete(deployment, f"{ns}/b", [1, 2, 3])
    url = f"{deployment.agent.url}/v1/agent/top"
    auth = deployment.agent.headers
    assert httpx.get(url, params={"k": 1}, timeout=10).status_code == 401
    reader = {"Authorization": f"Bearer {deployment.reader_token}"}
    assert httpx.get(url, params={"k": 1}, headers=reader, timeout=10).status_code == 403
    top = httpx.get(url, params={"k": 1}, headers=auth, timeout=10).json()
    assert len(top["tenants"]) == 1 and len(top["adapters"]) <= 1
    assert len(top["queue_waits"]) <= 1
    everyone = httpx.get(url, params={"k": 100}, headers=auth, timeout=10).json()
    assert ns in {t["tenant"] for t in everyone["tenants"]}
    assert all(t["completed_service"] > 0 for t in everyone["tenants"])
    for bad in (0, 101, "x"):
        assert httpx.get(url, params={"k": bad}, headers=auth, timeout=10).status_code == 422
