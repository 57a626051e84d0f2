"""Core registry and catalog flows over the REST API, on Postgres and on SQLite.

Jobs run inline (Celery eager mode) so each push is validated by the real
`validate_artifact` task before the test continues.
"""

from __future__ import annotations

from typing import Any

from cp_helpers import Api, Assets, push_dir, setup_namespace


def push_validated(api: Api, assets: Assets, adapter: Any, ns: str = "acme",
                   h_base: str | None = None) -> dict[str, Any]:
    r = push_dir(api.client, api.admin, ns, h_base or assets.h_base, adapter)
    assert r.status_code in (200, 202), r.text
    got = api.client.get(f"/v1/namespaces/{ns}/artifacts/{r.json()['id']}", headers=api.admin)
    body: dict[str, Any] = got.json()
    assert body["state"] == "validated", body
    return body


def publish(api: Api, alias: str, ref: Any, **body: Any) -> Any:
    return api.client.post(f"/v1/namespaces/acme/aliases/{alias}/publish", headers=api.admin,
                           json={"artifact": str(ref), **body})


def test_push_validates_and_dedupes(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    r = push_dir(api.client, api.admin, "acme", assets.h_base, assets.adapter_a)
    assert r.status_code == 202 and r.json()["state"] == "pending"
    art = api.client.get(f"/v1/namespaces/acme/artifacts/{r.json()['id']}",
                         headers=api.admin).json()
    assert art["state"] == "validated" and len(art["digest"]) == 64
    assert art["method"] == "lora" and art["base"] == assets.h_base
    assert art["modules"] and art["validation_attempts"] == 1
    assert art["storage_key"].startswith("blobs/sha256/")
    # the stored record re-derives the digest independently of the registry
    from dataplane.artifacts import ValidatedArtifact

    assert ValidatedArtifact.from_record(art["validated_record"]).h_artifact == art["digest"]
    again = push_dir(api.client, api.admin, "acme", assets.h_base, assets.adapter_a)
    assert again.status_code == 200 and again.json()["id"] == art["id"]
    by_digest = api.client.get(f"/v1/namespaces/acme/artifacts/sha256:{art['digest']}",
                               headers=api.admin)
    assert by_digest.json()["id"] == art["id"]
    # validated once, audited once
    audit = api.client.get("/v1/audit", headers=api.admin).json()["items"]
    assert [e["action"] for e in audit].count("artifact.validated") == 1


def test_rejected_artifact_keeps_code_and_cannot_be_published(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    r = push_dir(api.client, api.admin, "acme", assets.h_base, assets.adapter_big_rank)
    art = api.client.get(f"/v1/namespaces/acme/artifacts/{r.json()['id']}",
                         headers=api.admin).json()
    assert art["state"] == "rejected" and art["rejection"]["code"] == "rank_limit"
    assert art["digest"] is None and art["validation_attempts"] == 1
    bad = publish(api, "bot", art["id"])
    assert bad.status_code == 409 and bad.json()["code"] == "INVALID_STATE"


def test_publish_resolve_rollback_retire_history(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    a = push_validated(api, assets, assets.adapter_a)
    b = push_validated(api, assets, assets.adapter_b)
    g1 = publish(api, "bot", a["id"], expected_generation=0, reason="first")
    assert g1.status_code == 201, g1.text
    assert (g1.json()["generation"], g1.json()["action"]) == (1, "publish")
    g2 = publish(api, "bot", f"sha256:{b['digest']}", expected_generation=1)
    assert g2.json()["generation"] == 2 and g2.json()["artifact"]["id"] == b["id"]
    res = api.client.get("/v1/namespaces/acme/aliases/bot", headers=api.admin).json()
    assert (res["generation"], res["artifact"]["digest"], res["base"]) == (
        2, b["digest"], assets.h_base)

    rb = api.client.post("/v1/namespaces/acme/aliases/bot/rollback", headers=api.admin,
                         json={"expected_generation": 2})
    assert rb.status_code == 201, rb.text
    assert (rb.json()["generation"], rb.json()["action"], rb.json()["artifact"]["id"]) == (
        3, "rollback", a["id"])
    rb2 = api.client.post("/v1/namespaces/acme/aliases/bot/rollback", headers=api.admin,
                          json={"to_generation": 2})
    assert (rb2.json()["generation"], rb2.json()["artifact"]["id"]) == (4, b["id"])

    ret = api.client.post("/v1/namespaces/acme/aliases/bot/retire", headers=api.admin,
                          json={"reason": "eol"})
    assert ret.status_code == 201 and ret.json()["artifact"] is None
    gone = api.client.get("/v1/namespaces/acme/aliases/bot", headers=api.admin)
    assert gone.status_code == 410 and gone.json()["code"] == "ALIAS_RETIRED"
    twice = api.client.post("/v1/namespaces/acme/aliases/bot/retire", headers=api.admin, json={})
    assert twice.status_code == 409 and twice.json()["code"] == "INVALID_STATE"
    # rollback out of retirement restores the last served artifact
    back = api.client.post("/v1/namespaces/acme/aliases/bot/rollback", headers=api.admin,
                           json={})
    assert (back.json()["generation"], back.json()["artifact"]["id"]) == (6, b["id"])

    hist = api.client.get("/v1/namespaces/acme/aliases/bot/history?limit=4",
                          headers=api.admin).json()
    assert [g["generation"] for g in hist["items"]] == [6, 5, 4, 3]
    rest = api.client.get(f"/v1/namespaces/acme/aliases/bot/history?cursor={hist['next_cursor']}",
                          headers=api.admin).json()
    assert [g["generation"] for g in rest["items"]] == [2, 1] and rest["next_cursor"] is None
    assert [g["action"] for g in hist["items"] + rest["items"]] == [
        "rollback", "retire", "rollback", "rollback", "publish", "publish"]
    never = api.client.get("/v1/namespaces/acme/aliases/nobody", headers=api.admin)
    assert never.status_code == 404 and never.json()["code"] == "NOT_FOUND"
    audit = api.client.get("/v1/audit?namespace=acme", headers=api.admin).json()["items"]
    assert sum(e["action"].startswith("catalog.") for e in audit) == 6


def test_cas_conflict_and_bad_rollback_targets(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    a = push_validated(api, assets, assets.adapter_a)
    assert publish(api, "bot", a["id"]).status_code == 201
    stale = publish(api, "bot", a["id"], expected_generation=0)
    assert stale.status_code == 409 and stale.json()["code"] == "GENERATION_CONFLICT"
    assert stale.json()["detail"]["current_generation"] == 1
    nothing = api.client.post("/v1/namespaces/acme/aliases/bot/rollback", headers=api.admin,
                              json={})
    assert nothing.status_code == 409 and nothing.json()["code"] == "INVALID_STATE"
    future = api.client.post("/v1/namespaces/acme/aliases/bot/rollback", headers=api.admin,
                             json={"to_generation": 7})
    assert future.status_code == 404
    hist = api.client.get("/v1/namespaces/acme/aliases/bot/history", headers=api.admin).json()
    assert [g["generation"] for g in hist["items"]] == [1]


def test_idempotency_key(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    a = push_validated(api, assets, assets.adapter_a)
    b = push_validated(api, assets, assets.adapter_b)
    key = {"Idempotency-Key": "deploy-42", **api.admin}
    first = api.client.post("/v1/namespaces/acme/aliases/bot/publish", headers=key,
                            json={"artifact": str(a["id"]), "expected_generation": 0})
    assert first.status_code == 201
    replay = api.client.post("/v1/namespaces/acme/aliases/bot/publish", headers=key,
                             json={"artifact": str(a["id"]), "expected_generation": 0})
    assert replay.status_code == 200 and replay.json() == first.json()
    other = api.client.post("/v1/namespaces/acme/aliases/bot/publish", headers=key,
                            json={"artifact": str(b["id"]), "expected_generation": 0})
    assert other.status_code == 422 and other.json()["code"] == "IDEMPOTENCY_MISMATCH"
    hist = api.client.get("/v1/namespaces/acme/aliases/bot/history", headers=api.admin).json()
    assert len(hist["items"]) == 1


def test_base_mismatch_and_bad_input_change_nothing(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    r = api.client.post("/v1/bases", headers=api.admin, json={"name": "o", "abi": assets.other_abi})
    assert r.status_code == 201
    other_h = r.json()["h_base"]
    a = push_validated(api, assets, assets.adapter_a)
    o = push_validated(api, assets, assets.adapter_other_base, h_base=other_h)
    assert publish(api, "bot", a["id"]).status_code == 201
    mism = publish(api, "bot", o["id"])
    assert mism.status_code == 422 and mism.json()["code"] == "BASE_MISMATCH"
    # the gate_proj adapter of base B (intermediate 96) pushed as base A: rejected
    wrong = push_dir(api.client, api.admin, "acme", assets.h_base, assets.adapter_other_base)
    art = api.client.get(f"/v1/namespaces/acme/artifacts/{wrong.json()['id']}",
                         headers=api.admin).json()
    assert art["state"] == "rejected"
    assert art["rejection"]["code"] in ("shape_mismatch", "wrong_base")

    before = api.client.get("/v1/audit", headers=api.admin).json()["items"]
    bad_requests = [
        ("post", "/v1/namespaces/acme/aliases/bot/publish", {"artifact": "999"}, 404),
        ("post", "/v1/namespaces/acme/aliases/bot/publish", {"artifact": "x"}, 404),
        ("post", "/v1/namespaces/acme/aliases/bot/publish",
         {"artifact": str(a["id"]), "expected_generation": -1}, 422),
        ("post", "/v1/namespaces/acme/aliases/bad%20name/publish", {"artifact": "1"}, 422),
        ("post", "/v1/namespaces/nope/aliases/bot/publish", {"artifact": "1"}, 404),
        ("post", "/v1/namespaces", {"name": "Bad_Name"}, 422),
        ("post", "/v1/namespaces", {"name": "acme"}, 409),
        ("post", "/v1/bases", {"name": "x", "abi": {"architecture": "x"}}, 422),
        ("post", "/v1/namespaces/acme/artifacts", {"base": "0" * 64, "uri": "file:///nope"}, 404),
        ("post", "/v1/namespaces/acme/artifacts", {"base": assets.h_base, "uri": "http://x"},
         422),
        ("post", "/v1/namespaces/acme/artifacts",  # file:// imports are off by default
         {"base": assets.h_base, "uri": assets.adapter_with_bin.as_uri()}, 403),
        ("get", "/v1/namespaces/acme/artifacts?cursor=%%%", None, 422),
    ]
    for method, path, body, status in bad_requests:
        resp = api.client.request(method, path, headers=api.admin, json=body)
        assert resp.status_code == status, (path, body, resp.text)
        assert set(resp.json()) == {"error", "code", "detail"}
    after = api.client.get("/v1/audit", headers=api.admin).json()["items"]
    assert after == before
    arts = api.client.get("/v1/namespaces/acme/artifacts", headers=api.admin).json()["items"]
    assert len(arts) == 3


def test_push_by_file_uri_and_artifact_pagination(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    api.settings.allow_file_uri_import = True  # off by default; the app reads these settings
    api.settings.file_import_roots = [assets.adapter_a.parent]
    ids = []
    for adapter in (assets.adapter_a, assets.adapter_b, assets.adapter_big_rank):
        r = api.client.post("/v1/namespaces/acme/artifacts", headers=api.admin,
                            json={"base": assets.h_base, "uri": adapter.as_uri()})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    seen: list[int] = []
    cursor = None
    while True:
        q = "/v1/namespaces/acme/artifacts?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = api.client.get(q, headers=api.admin).json()
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)
    validated = api.client.get("/v1/namespaces/acme/artifacts?state=validated",
                               headers=api.admin).json()["items"]
    assert sorted(i["id"] for i in validated) == ids[:2]
    bases = api.client.get("/v1/bases", headers=api.admin).json()
    assert [b["h_base"] for b in bases["items"]] == [assets.h_base]
    again = api.client.post("/v1/bases", headers=api.admin, json={"name": "t", "abi": assets.abi})
    assert again.status_code == 200


def test_alias_listing(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    a = push_validated(api, assets, assets.adapter_a)
    for name in ("one", "two", "three"):
        assert publish(api, name, a["id"]).status_code == 201
    api.client.post("/v1/namespaces/acme/aliases/two/retire", headers=api.admin, json={})
    page = api.client.get("/v1/namespaces/acme/aliases?limit=2", headers=api.admin).json()
    rest = api.client.get(f"/v1/namespaces/acme/aliases?cursor={page['next_cursor']}",
                          headers=api.admin).json()
    rows = {r["alias"]: (r["generation"], r["action"]) for r in page["items"] + rest["items"]}
    assert rows == {"one": (1, "publish"), "two": (2, "retire"), "three": (1, "publish")}


def test_size_limit_refuses_push_without_rows(sqlite_url: str, tmp_path: Any,
                                              assets: Assets) -> None:
    """The limit is enforced while streaming: the config fits, the weights do not."""
    from cp_helpers import bootstrap_token, close_app, make_settings
    from fastapi.testclient import TestClient

    from controlplane.app import create_app

    limit = (assets.adapter_a / "adapter_config.json").stat().st_size + 10
    settings = make_settings(sqlite_url, tmp_path / "var", max_artifact_bytes=limit,
                             allow_file_uri_import=True,
                             file_import_roots=[assets.adapter_a.parent])
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    try:
        client = TestClient(app)
        setup_namespace(Api(app=app, client=client, settings=settings, admin=admin), assets.abi)
        upload = push_dir(client, admin, "acme", assets.h_base, assets.adapter_a)
        by_uri = client.post("/v1/namespaces/acme/artifacts", headers=admin,
                             json={"base": assets.h_base, "uri": assets.adapter_a.as_uri()})
        for resp in (upload, by_uri):
            assert resp.status_code == 413, resp.text
            assert resp.json()["code"] == "ARTIFACT_TOO_LARGE"
        assert client.get("/v1/namespaces/acme/artifacts", headers=admin).json()["items"] == []
    finally:
        close_app(app)


def test_bad_multipart_pushes_store_nothing(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    cfg = (assets.adapter_a / "adapter_config.json").read_bytes()
    weights = (assets.adapter_a / "adapter_model.safetensors").read_bytes()
    cases = [
        ({"adapter_config.json": cfg}, "MISSING_FILE"),
        ({"adapter_config.json": cfg, "adapter_model.safetensors": weights,
          "adapter_model.bin": b"pickle"}, "FORBIDDEN_FILE"),
        ({"adapter_config.json": cfg, "adapter_model.safetensors": weights,
          "notes.txt": b"x"}, "VALIDATION_ERROR"),
    ]
    for files, code in cases:
        r = api.client.post("/v1/namespaces/acme/artifacts", headers=api.admin,
                            data={"base": assets.h_base},
                            files={n: (n, b) for n, b in files.items()})
        assert (r.status_code, r.json()["code"]) == (422, code), r.text
    huge = api.client.post("/v1/namespaces/acme/artifacts", headers=api.admin,
                           json={"base": assets.h_base,
                                 "uri": "s3://b/" + "x" * api.settings.max_json_body_bytes})
    assert (huge.status_code, huge.json()["code"]) == (413, "REQUEST_TOO_LARGE")
    no_base = api.client.post("/v1/namespaces/acme/artifacts", headers=api.admin,
                              files={"adapter_config.json": ("c", cfg)})
    assert no_base.status_code == 422
    assert api.client.get("/v1/namespaces/acme/artifacts", headers=api.admin).json() == {
        "items": [], "next_cursor": None}
    objects = api.settings.data_dir / "objects"
    assert not objects.exists() or not any(p.is_file() for p in objects.rglob("*"))
