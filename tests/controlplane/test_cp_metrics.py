"""The admin API's `GET /metrics` (controlplane/metrics): requests counted by route
template and status, job rows waiting for a worker, agents by state, heartbeat age and
publish → agent propagation lag read from the rows at scrape time, a database that cannot
be read, and docs/METRICS.md naming exactly what is exported. Reference values come from
the rows themselves (written or back-dated here with plain SQL), not from the code under
test. On Postgres and on SQLite where the `api` fixture is used."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cp_helpers import (
    Api,
    Assets,
    bootstrap_token,
    close_app,
    make_settings,
    push_dir,
    setup_namespace,
)
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, update
from test_cp_catalog_flows import publish, push_validated

from controlplane.app import create_app
from controlplane.models import Artifact, CatalogGeneration, utcnow
from controlplane.models.agent import Agent

ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: TestClient) -> Samples:
    r = client.get("/metrics")  # no token: like the agents' and routers' /metrics
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def requests(samples: Samples, method: str, route: str, status: int) -> float:
    return value(samples, "adapterplane_api_requests_total", method=method, route=route,
                 status=str(status))


def durations(samples: Samples, method: str, route: str) -> float:
    return value(samples, "adapterplane_api_request_duration_seconds_count", method=method,
                 route=route)


def test_each_request_is_counted_by_route_template_and_status(api: Api,
                                                              assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    before = scrape(api.client)
    aliases = "/v1/namespaces/{namespace}/aliases"
    publish_route = "/v1/namespaces/{namespace}/aliases/{alias}/publish"
    assert api.client.get("/v1/namespaces/acme/aliases", headers=api.admin).status_code == 200
    assert api.client.get("/v1/namespaces/acme/aliases", headers=api.admin).status_code == 200
    # refused by the auth gate before routing: still its route's template
    assert api.client.post("/v1/namespaces/acme/aliases/bot/publish",
                           json={}).status_code == 401
    assert api.client.get("/no/such/path", headers=api.admin).status_code == 404
    assert api.client.request("BREW", "/v1/namespaces", headers=api.admin).status_code in (
        401, 405)
    after = scrape(api.client)

    assert requests(after, "GET", aliases, 200) - requests(before, "GET", aliases, 200) == 2
    assert durations(after, "GET", aliases) - durations(before, "GET", aliases) == 2
    assert requests(after, "POST", publish_route, 401) == 1
    assert requests(after, "GET", "unmatched", 404) == 1
    methods = {dict(labels)["method"] for name, labels in after
               if name == "adapterplane_api_requests_total"}
    assert "BREW" not in methods and "OTHER" in methods
    routes = {dict(labels)["route"] for name, labels in after
              if name == "adapterplane_api_requests_total"}
    assert all(r == "unmatched" or r.startswith("/") for r in routes), routes
    assert not any("acme" in r or "bot" in r for r in routes), routes  # templates only
    # the histogram's buckets are cumulative and end at its count
    inf = value(after, "adapterplane_api_request_duration_seconds_bucket", method="GET",
                route=aliases, le="+Inf")
    assert inf == durations(after, "GET", aliases)


@pytest.fixture
def queued_api(pg_url: str, tmp_path: Path) -> Iterator[Api]:
    """Jobs are sent to an in-memory broker no worker reads: pushed rows stay pending."""
    settings = make_settings(pg_url, tmp_path / "var", celery_task_always_eager=False)
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    with TestClient(app) as client:
        yield Api(app=app, client=client, settings=settings, admin=admin)
    close_app(app)


def test_queued_jobs_show_in_depth_and_age(queued_api: Api, assets: Assets) -> None:
    api = queued_api
    setup_namespace(api, assets.abi)
    empty = scrape(api.client)
    assert value(empty, "adapterplane_jobs_queued", kind="artifact", state="pending") == 0
    assert value(empty, "adapterplane_jobs_oldest_queued_age_seconds", kind="artifact") == 0

    ids = [push_dir(api.client, api.admin, "acme", assets.h_base, a).json()["id"]
           for a in (assets.adapter_a, assets.adapter_b)]
    with api.app.state.session_factory() as session:  # the oldest pushed 300 s ago
        session.execute(update(Artifact).where(Artifact.id == ids[0])
                        .values(created_at=utcnow() - timedelta(seconds=300)))
        session.commit()
        pending = session.query(Artifact).filter(Artifact.state == "pending").count()
    assert pending == 2
    got = scrape(api.client)
    assert value(got, "adapterplane_jobs_queued", kind="artifact", state="pending") == 2
    assert value(got, "adapterplane_jobs_queued", kind="artifact", state="validating") == 0
    assert value(got, "adapterplane_jobs_queued", kind="collection", state="pending") == 0
    age = value(got, "adapterplane_jobs_oldest_queued_age_seconds", kind="artifact")
    assert 300 <= age < 330, age
    assert value(got, "adapterplane_database_up") == 1


def _register(api: Api, assets: Assets, name: str) -> tuple[dict[str, str], dict[str, Any]]:
    who = api.token([], is_agent=True, name=name)
    r = api.client.post("/v1/agents/register", headers=who, json={
        "name": name, "url": "http://127.0.0.1:1",
        "capabilities": {"base": assets.h_base, "dtypes": ["float32"], "max_rank": 16,
                         "targets": ["q_proj", "v_proj"], "adapter_slots": 2,
                         "pool_pages": 100, "page_bytes": 4096, "kv_reserve_pages": 50,
                         "served_model_name": "tiny"}})
    assert r.status_code == 201, r.text
    return who, dict(r.json())


def _beat(api: Api, who: dict[str, str], agent: dict[str, Any], version: int) -> None:
    r = api.client.post(f"/v1/agents/{agent['id']}/heartbeat", headers=who,
                        json={"worker_epoch": agent["worker_epoch"], "catalog_version": version})
    assert r.status_code == 200, r.text


def _backdate(api: Api, model: Any, row_id: int, seconds: float, **column: Any) -> None:
    with api.app.state.session_factory() as session:
        values = {name: utcnow() - timedelta(seconds=seconds) for name in column}
        session.execute(update(model).where(model.id == row_id).values(**values))
        session.commit()


def test_agents_heartbeat_age_and_propagation_lag(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    art = push_validated(api, assets, assets.adapter_a)
    first = publish(api, "bot", art["id"]).json()
    who0, gpu0 = _register(api, assets, "gpu-0")
    who1, gpu1 = _register(api, assets, "gpu-1")
    who2, gpu2 = _register(api, assets, "gpu-2")
    with api.app.state.session_factory() as session:
        applied = int(session.query(func.max(CatalogGeneration.id)).scalar() or 0)
    assert applied > 0
    _beat(api, who0, gpu0, applied)  # current
    _beat(api, who1, gpu1, applied)  # will fall behind the next publish
    second = publish(api, "bot", art["id"], reason="again").json()
    assert second["generation"] == first["generation"] + 1
    with api.app.state.session_factory() as session:
        newest = session.query(CatalogGeneration).order_by(CatalogGeneration.id.desc()).first()
        assert newest is not None
        newest_id = newest.id
    _backdate(api, CatalogGeneration, newest_id, 120, created_at=True)
    _beat(api, who0, gpu0, newest_id)
    _beat(api, who2, gpu2, newest_id)
    _backdate(api, Agent, gpu2["id"], 400, last_heartbeat_at=True)  # silent: stale

    got = scrape(api.client)
    assert value(got, "adapterplane_catalog_version") == newest_id
    assert value(got, "adapterplane_agent_catalog_lag_seconds", agent="gpu-0") == 0
    lag = value(got, "adapterplane_agent_catalog_lag_seconds", agent="gpu-1")
    assert 120 <= lag < 150, lag
    # a stale agent's lag is not reported; its silence is
    assert ("adapterplane_agent_catalog_lag_seconds", frozenset({("agent", "gpu-2")})) not in got
    age = value(got, "adapterplane_agent_heartbeat_age_seconds", agent="gpu-2")
    assert 400 <= age < 430, age
    assert value(got, "adapterplane_agent_heartbeat_age_seconds", agent="gpu-0") < 30
    assert value(got, "adapterplane_agents", state="live") == 2
    assert value(got, "adapterplane_agents", state="stale") == 1

    # asked to drain: counted as draining, and no longer in the per-agent gauges
    assert api.client.post(f"/v1/agents/{gpu1['id']}/drain",
                           headers=api.admin).status_code == 200
    drained = scrape(api.client)
    assert value(drained, "adapterplane_agents", state="draining") == 1
    assert value(drained, "adapterplane_agents", state="live") == 1
    assert not any(dict(labels).get("agent") == "gpu-1" for _, labels in drained)


def test_an_unreadable_database_still_answers(tmp_path: Path) -> None:
    """Nothing listens on port 1: the scrape reports `adapterplane_database_up 0`, no row
    gauges, and the request metrics."""
    url = "postgresql+psycopg://adapterplane:adapterplane@127.0.0.1:1/none"
    app = create_app(make_settings(url, tmp_path / "var"))
    try:
        with TestClient(app) as client:
            assert client.get("/healthz").status_code == 200
            got = scrape(client)
    finally:
        close_app(app)
    assert value(got, "adapterplane_database_up") == 0
    assert not any(name.startswith(("adapterplane_jobs_", "adapterplane_agent"))
                   for name, _ in got)
    assert requests(got, "GET", "/healthz", 200) == 1


def test_metrics_is_outside_the_rest_contract(api: Api) -> None:
    assert "/metrics" not in api.client.get("/openapi.json").json()["paths"]


def test_every_control_plane_metric_is_documented(api: Api) -> None:
    assert api.client.get("/healthz").status_code == 200  # a request metric has a sample
    doc = (ROOT / "docs" / "METRICS.md").read_text().split("## Control-plane metrics")[1]
    documented = set(re.findall(r"^\| `(adapterplane_[a-z_]+)` \|", doc, re.M))
    text = api.client.get("/metrics").text
    exported = {f.name + ("_total" if f.type == "counter" else "")
                for f in text_string_to_metric_families(text) if not f.name.endswith("_created")}
    assert exported and exported == documented, exported ^ documented
