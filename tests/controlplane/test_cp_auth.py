"""Bearer tokens: 401 without/with bad/revoked tokens, 403 without the scope, namespace
grants, agent role, admin-only routes. Runs on Postgres and SQLite."""

from __future__ import annotations

from cp_helpers import Api, Assets, bootstrap_token, push_dir, setup_namespace


def test_every_route_but_health_needs_a_token(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    ready = api.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {
        "database": "ok", "storage": "ok"}
    for path in ("/v1/bases", "/v1/namespaces", "/v1/audit", "/v1/namespaces/acme/artifacts",
                 "/v1/namespaces/acme/aliases/x"):
        for headers in ({}, {"Authorization": "Bearer ap_wrong"}, {"Authorization": "Basic x"}):
            r = api.client.get(path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json()["code"] == "UNAUTHENTICATED"
    spec = api.client.get("/openapi.json").json()
    assert "ErrorBody" in spec["components"]["schemas"]


def test_scopes(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi, "acme")
    setup_namespace(api, assets.abi, "other")
    reader = api.token([{"namespace": "acme", "role": "read"}])
    publisher = api.token([{"namespace": "acme", "role": "publish"}])
    ns_admin = api.token([{"namespace": "acme", "role": "admin"}])
    agent = api.token([], is_agent=True)

    denied = push_dir(api.client, reader, "acme", assets.h_base, assets.adapter_a)
    assert denied.status_code == 403 and denied.json()["code"] == "FORBIDDEN"
    pushed = push_dir(api.client, publisher, "acme", assets.h_base, assets.adapter_a)
    assert pushed.status_code == 202
    art = pushed.json()["id"]
    other = push_dir(api.client, publisher, "other", assets.h_base, assets.adapter_a)
    assert other.status_code == 403

    pub = "/v1/namespaces/acme/aliases/bot/publish"
    assert api.client.post(pub, headers=reader, json={"artifact": str(art)}).status_code == 403
    assert api.client.post(pub, headers=agent, json={"artifact": str(art)}).status_code == 403
    assert api.client.post(pub, headers=publisher, json={"artifact": str(art)}).status_code == 201
    # the artifact id of namespace acme is not visible from namespace other
    assert api.client.post("/v1/namespaces/other/aliases/bot/publish", headers=api.admin,
                           json={"artifact": str(art)}).status_code == 404

    for who in (reader, publisher, agent):
        assert api.client.get("/v1/namespaces/acme/aliases/bot", headers=who).status_code == 200
    assert api.client.get("/v1/namespaces/other/aliases", headers=agent).status_code == 200
    assert api.client.get("/v1/namespaces/other/aliases", headers=reader).status_code == 403

    # admin-only: bases, namespaces, tokens, global audit; namespace admin sees its audit
    for who in (reader, publisher, agent, ns_admin):
        assert api.client.post("/v1/namespaces", headers=who,
                               json={"name": "x"}).status_code == 403
        assert api.client.post("/v1/bases", headers=who,
                               json={"name": "t", "abi": assets.abi}).status_code == 403
        assert api.client.post("/v1/tokens", headers=who,
                               json={"name": "n", "grants": []}).status_code == 403
        assert api.client.get("/v1/audit", headers=who).status_code == 403
    assert api.client.get("/v1/audit?namespace=acme", headers=ns_admin).status_code == 200
    assert api.client.get("/v1/audit?namespace=other", headers=ns_admin).status_code == 403
    visible = api.client.get("/v1/namespaces", headers=reader).json()["items"]
    assert [n["name"] for n in visible] == ["acme"]
    audit = api.client.get("/v1/audit?namespace=acme", headers=api.admin).json()["items"]
    publish_rows = [e for e in audit if e["action"] == "catalog.publish"]
    assert len(publish_rows) == 1 and publish_rows[0]["actor"].endswith(":t")


def test_tokens_are_hashed_and_revocable(api: Api) -> None:
    r = api.client.post("/v1/tokens", headers=api.admin,
                        json={"name": "ci", "grants": [{"namespace": "*", "role": "read"}]})
    body = r.json()
    assert r.status_code == 201 and body["token"].startswith("ap_")
    headers = {"Authorization": f"Bearer {body['token']}"}
    assert api.client.get("/v1/bases", headers=headers).status_code == 200
    bad_grant = api.client.post("/v1/tokens", headers=api.admin, json={
        "name": "x", "grants": [{"namespace": "acme", "role": "owner"}]})
    assert bad_grant.status_code == 422 and bad_grant.json()["code"] == "VALIDATION_ERROR"
    assert api.client.delete(f"/v1/tokens/{body['id']}", headers=api.admin).json()["revoked"]
    assert api.client.get("/v1/bases", headers=headers).status_code == 401
    # the plaintext is nowhere in the database
    from sqlalchemy import select

    from controlplane.models import ApiToken

    with api.app.state.session_factory() as session:
        stored = session.scalars(select(ApiToken)).all()
    assert all(body["token"] not in (t.token_sha256, t.name) for t in stored)
    assert len({t.token_sha256 for t in stored}) == len(stored)
    second_admin = bootstrap_token(api.settings)
    assert api.client.get("/v1/audit", headers={
        "Authorization": f"Bearer {second_admin}"}).status_code == 200


def test_openapi_documents_the_error_body(api: Api) -> None:
    spec = api.client.get("/openapi.json").json()
    ref = "#/components/schemas/ErrorBody"
    for path, methods in spec["paths"].items():
        if path in ("/healthz", "/readyz"):
            continue
        for method, op in methods.items():
            for status in ("401", "403", "404", "422"):
                schema = op["responses"][status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": ref}, (method, path, status)
    push = spec["paths"]["/v1/namespaces/{namespace}/artifacts"]["post"]
    assert set(push["requestBody"]["content"]) == {"application/json", "multipart/form-data"}
