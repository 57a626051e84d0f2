"""Compress-then-Serve collections over the REST API, on Postgres and on SQLite.

Jobs run inline (Celery eager mode): each submit runs the real `fit_collection` task
(fetch from the object store, fit, store the bundle, finish) before the test continues.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
from cp_helpers import Api, Assets, push_dir, setup_namespace
from test_cp_catalog_flows import push_validated

from controlplane.contracts import DesiredState

ROOT = "/v1/namespaces/acme/collections"


@pytest.fixture(scope="module")
def third_adapter(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dataplane.assets import make_peft_adapter

    return make_peft_adapter(assets.base_dir, tmp_path_factory.mktemp("third") / "c", seed=7,
                             rank=2, alpha=4, target_modules=["q_proj", "v_proj"])


def _members(api: Api, assets: Assets, third: Path) -> list[dict[str, Any]]:
    setup_namespace(api, assets.abi)
    return [push_validated(api, assets, p) for p in (assets.adapter_a, assets.adapter_b, third)]


def _submit(api: Api, sources: list[Any], **spec: Any) -> Any:
    body = {"name": "support-bots", "base": spec.pop("base", None), "sources": sources,
            **spec}
    return api.client.post(ROOT, headers=api.admin, json=body)


def _get(api: Api, cid: int) -> dict[str, Any]:
    body: dict[str, Any] = api.client.get(f"{ROOT}/{cid}", headers=api.admin).json()
    return body


def test_fit_emits_a_bundle_and_members_become_artifacts(api: Api, assets: Assets,
                                                        third_adapter: Path) -> None:
    a, b, c = _members(api, assets, third_adapter)
    refs = [a["id"], f"sha256:{b['digest']}", str(c["id"])]
    # rank 14 = 4 + 8 + 2 covers every member's column and row spaces: lossless
    r = _submit(api, refs, base=assets.h_base, rank=14, max_relative_error="1/100000")
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "pending"
    fitted = _get(api, r.json()["id"])
    assert fitted["state"] == "fitted", fitted
    assert [s["digest"] for s in fitted["sources"]] == [a["digest"], b["digest"], c["digest"]]
    assert len(fitted["digest"]) == 64 and fitted["assignment"] == [0, 0, 0]
    assert sorted(fitted["files"]) == ["collection.json", "collection.safetensors"]
    assert fitted["size_bytes"] == sum(f["size"] for f in fitted["files"].values())
    assert fitted["metrics"]["max_relative_error"] < 1e-5
    assert fitted["spec"]["max_relative_error"] == "1/100000"
    by_digest = api.client.get(f"{ROOT}/sha256:{fitted['digest']}", headers=api.admin).json()
    assert by_digest["id"] == fitted["id"]

    again = _submit(api, refs, base=assets.h_base, rank=14, max_relative_error="0.00001")
    assert again.status_code == 200 and again.json()["id"] == fitted["id"]

    bundle = api.client.get(f"{ROOT}/{fitted['id']}/bundle", headers=api.admin).json()
    assert bundle["digest"] == fitted["digest"] and bundle["url_ttl_s"] > 0
    for name, meta in bundle["files"].items():
        data = Path(unquote(urlparse(meta["url"]).path)).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (
            fitted["files"][name]["size"], fitted["files"][name]["sha256"])

    member = api.client.post(f"{ROOT}/{fitted['id']}/members/1/artifact", headers=api.admin)
    assert member.status_code == 202, member.text
    art = api.client.get(f"/v1/namespaces/acme/artifacts/{member.json()['id']}",
                         headers=api.admin).json()
    assert art["state"] == "validated", art
    assert {m["rank"] for m in art["validated_record"]["modules"]} == {14}
    same = api.client.post(f"{ROOT}/{fitted['id']}/members/1/artifact", headers=api.admin)
    assert same.status_code == 200 and same.json()["id"] == art["id"]

    # agents learn which member an artifact is: desired state carries the bundle's URLs
    for alias, artifact_id in (("compressed", art["id"]), ("plain", a["id"])):
        r = api.client.post(f"/v1/namespaces/acme/aliases/{alias}/publish", headers=api.admin,
                            json={"artifact": str(artifact_id)})
        assert r.status_code in (200, 201), r.text
    agent = api.token([], is_agent=True, name="collections-agent")
    caps = {"base": assets.h_base, "dtypes": ["float32"], "max_rank": 16,
            "targets": ["q_proj", "v_proj"], "adapter_slots": 2, "pool_pages": 100,
            "page_bytes": 4096, "kv_reserve_pages": 50}
    me = api.client.post("/v1/agents/register", headers=agent, json={
        "name": "collections-agent", "url": "http://127.0.0.1:1", "capabilities": caps})
    assert me.status_code == 201, me.text
    state = api.client.get(f"/v1/agents/{me.json()['id']}/desired-state", headers=agent,
                           params={"worker_epoch": me.json()["worker_epoch"]}).json()
    # the shared contract is the whole wire format, with and without a collection link
    assert DesiredState.model_validate(state).model_dump(mode="json") == state
    docs = {i["alias"]: i["generations"][0]["artifact"] for i in state["aliases"]
            if i["namespace"] == "acme"}
    link = docs["compressed"]["collection"]
    assert (link["id"], link["digest"], link["member"]) == (fitted["id"], fitted["digest"], 1)
    assert {n: m["sha256"] for n, m in link["files"].items()} == {
        n: m["sha256"] for n, m in fitted["files"].items()}
    assert "collection" not in docs["plain"]

    audit = [e["action"] for e in api.client.get("/v1/audit", headers=api.admin)
             .json()["items"]]
    assert audit.count("collection.submit") == 1 and audit.count("collection.fitted") == 1


def test_release_threshold_rejects_with_metrics(api: Api, assets: Assets,
                                                third_adapter: Path) -> None:
    members = _members(api, assets, third_adapter)
    r = _submit(api, [m["id"] for m in members], base=assets.h_base, rank=2,
                method="jd-diag", max_relative_error="1/1000")
    assert r.status_code == 202, r.text
    done = _get(api, r.json()["id"])
    assert done["state"] == "rejected"
    assert done["rejection"]["code"] == "release_refused"
    assert done["metrics"]["max_relative_error"] > 1e-3
    assert done["digest"] is None and done["files"] is None
    refused = api.client.post(f"{ROOT}/{done['id']}/members/0/artifact", headers=api.admin)
    assert refused.status_code == 409 and refused.json()["code"] == "INVALID_STATE"
    no_bundle = api.client.get(f"{ROOT}/{done['id']}/bundle", headers=api.admin)
    assert no_bundle.status_code == 409 and no_bundle.json()["code"] == "INVALID_STATE"


def test_bad_requests_change_nothing(api: Api, assets: Assets, third_adapter: Path,
                                     tmp_path: Path) -> None:
    from dataplane.assets import make_peft_adapter

    a, b, c = _members(api, assets, third_adapter)
    alora = push_validated(api, assets, make_peft_adapter(
        assets.base_dir, tmp_path / "alora", seed=8, rank=2, alpha=4,
        target_modules=["q_proj", "v_proj"], alora_invocation_tokens=[5, 6]))
    other = api.client.post("/v1/bases", headers=api.admin,
                            json={"name": "o", "abi": assets.other_abi}).json()["h_base"]
    o = push_validated(api, assets, assets.adapter_other_base, h_base=other)
    big = push_dir(api.client, api.admin, "acme", assets.h_base, assets.adapter_big_rank)
    reader = api.token([{"namespace": "acme", "role": "read"}])
    before = api.client.get("/v1/audit", headers=api.admin).json()["items"]
    h = assets.h_base
    cases = [
        (dict(sources=[a["id"], big.json()["id"]], base=h, rank=2), 409, "INVALID_STATE"),
        (dict(sources=[a["id"], o["id"]], base=h, rank=2), 422, "BASE_MISMATCH"),
        (dict(sources=[a["id"], f"sha256:{a['digest']}"], base=h, rank=2), 422,
         "VALIDATION_ERROR"),
        (dict(sources=[a["id"], b["id"]], base=h, rank=2, clusters=3), 422, "VALIDATION_ERROR"),
        (dict(sources=[a["id"], b["id"]], base=h, rank=2, max_relative_error="2"), 422,
         "VALIDATION_ERROR"),
        (dict(sources=[a["id"], b["id"]], base=h, rank=2, max_relative_error="x"), 422,
         "VALIDATION_ERROR"),
        (dict(sources=[a["id"], 999999], base=h, rank=2), 404, "NOT_FOUND"),
        (dict(sources=[a["id"], b["id"]], base="0" * 64, rank=2), 404, "NOT_FOUND"),
        (dict(sources=[], base=h, rank=2), 422, "VALIDATION_ERROR"),
        (dict(sources=[a["id"]], base=h, rank=0), 422, "VALIDATION_ERROR"),
        (dict(sources=[a["id"], alora["id"]], base=h, rank=2), 422, "ALORA_UNSUPPORTED"),
    ]
    for spec, status, code in cases:
        r = _submit(api, **spec)
        assert (r.status_code, r.json()["code"]) == (status, code), (spec, r.text)
    r = api.client.post(ROOT, headers=reader, json={"name": "n", "base": h, "rank": 2,
                                                     "sources": [a["id"], c["id"]]})
    assert r.status_code == 403
    assert api.client.get(ROOT, headers=reader).json()["items"] == []
    after = api.client.get("/v1/audit", headers=api.admin).json()["items"]
    assert after == before


def test_rank_beyond_the_module_shape_is_rejected_by_the_fit(api: Api, assets: Assets,
                                                            third_adapter: Path) -> None:
    members = _members(api, assets, third_adapter)
    r = _submit(api, [m["id"] for m in members], base=assets.h_base, rank=4000)
    done = _get(api, r.json()["id"])
    assert done["state"] == "rejected" and done["rejection"]["code"] == "collection_invalid"
    assert "shared rank" in done["rejection"]["message"]
