"""Every metric name deploy/grafana/adapterplane.json and deploy/prometheus/alerts.yml read
is exported by the component that owns it, running: the session's CPU agent, its control
plane's API process (`adapterplane api`) and a router process in front of them, after one
request through the router (so the latency histograms have samples).

Owners by prefix: `adapterplane_router_` the router, other `adapterplane_` the admin
API, the rest (`adapter_`, `joint_`, `prefix_cache_`) the agent; `up` is Prometheus's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from agent.router.process import RouterProcess
from tests.deploy.observability import SYNTHETIC, exported_names, used_metric_names

from .conftest import Deployment


@pytest.fixture(scope="module")
def router(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RouterProcess]:
    token = deployment.admin.token("observability-router", [{"namespace": "*",
                                                              "role": "read"}])
    process = RouterProcess(Path(tmp_path_factory.mktemp("obs-router")) / "router.log", {
        "ADAPTERPLANE_ROUTER_CONTROL_PLANE_URL": deployment.cp.url,
        "ADAPTERPLANE_ROUTER_TOKEN": token})
    process.start()
    try:
        yield process
    finally:
        process.stop()


def owner(name: str) -> str:
    if name.startswith("adapterplane_router_"):
        return "router"
    return "api" if name.startswith("adapterplane_") else "agent"


def test_every_metric_the_dashboard_and_alerts_read_is_exported(
        deployment: Deployment, router: RouterProcess) -> None:
    model = f"{deployment.namespace}/a"
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key=deployment.reader_token,
                           max_retries=0, timeout=60.0)
    answer = client.completions.create(model=model, prompt=[3, 4, 5], max_tokens=3,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert len(answer.choices[0].model_extra["token_ids"]) == 3
    scraped = {name: httpx.get(f"{url}/metrics", timeout=10).text for name, url in (
        ("agent", deployment.agent.url), ("api", deployment.cp.url), ("router", router.url))}
    exported = {name: exported_names(text) for name, text in scraped.items()}
    # the request went through: the latency histograms of agent and router have samples
    assert "adapter_ttft_seconds_bucket{" in scraped["agent"]
    assert "adapterplane_router_admission_seconds_bucket{" in scraped["router"]
    assert 'adapterplane_api_requests_total{method="GET"' in scraped["api"]

    used = used_metric_names() - SYNTHETIC
    assert len(used) >= 30, used
    missing = {n: owner(n) for n in used if n not in exported[owner(n)]}
    assert not missing, missing
