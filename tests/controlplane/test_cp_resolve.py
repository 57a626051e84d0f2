"""Resolve (the one-statement hot path: token check + resolution together): the same
answer as the alias's history, errors in the order 401 > 403 > 404 > 410, and a
revoked token refused on the very next request. Runs on Postgres and SQLite."""

from __future__ import annotations

from pathlib import Path

from cp_helpers import Api, Assets, setup_namespace
from test_cp_catalog_flows import publish, push_validated


def _get(api: Api, path: str, headers: dict[str, str]) -> tuple[int, str]:
    r = api.client.get(f"/v1/namespaces/{path}", headers=headers)
    return r.status_code, r.json().get("code", "")


def test_resolution_is_the_current_generation_of_history(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    a = push_validated(api, assets, assets.adapter_a)
    b = push_validated(api, assets, assets.adapter_b)
    assert publish(api, "bot", a["id"], reason="one").status_code == 201
    assert publish(api, "bot", b["id"], reason="two").status_code == 201
    rollback = api.client.post("/v1/namespaces/acme/aliases/bot/rollback", headers=api.admin,
                               json={"reason": "back"})
    assert rollback.status_code == 201
    resolved = api.client.get("/v1/namespaces/acme/aliases/bot", headers=api.admin).json()
    newest = api.client.get("/v1/namespaces/acme/aliases/bot/history",
                            headers=api.admin).json()["items"][0]
    assert resolved == {**newest, "base": assets.h_base, "hot": False}
    assert resolved["artifact"] == {"id": a["id"], "digest": a["digest"],
                                    "base": assets.h_base, "method": "lora"}
    assert rollback.json() == newest  # what the write returned is what was stored
    listed = api.client.get("/v1/namespaces/acme/aliases", headers=api.admin).json()
    assert listed == {"items": [resolved], "next_cursor": None}


def test_error_order_and_revocation_at_once(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    a = push_validated(api, assets, assets.adapter_a)
    assert publish(api, "bot", a["id"]).status_code == 201
    assert publish(api, "old", a["id"]).status_code == 201
    assert api.client.post("/v1/namespaces/acme/aliases/old/retire", headers=api.admin,
                           json={}).status_code == 201
    other = api.token([{"namespace": "elsewhere", "role": "read"}])
    reader = api.token([{"namespace": "acme", "role": "read"}])
    unknown = {"Authorization": "Bearer ap_" + "0" * 43}

    assert _get(api, "nope/aliases/bot", unknown) == (401, "UNAUTHENTICATED")
    assert _get(api, "nope/aliases/bot", {}) == (401, "UNAUTHENTICATED")
    assert _get(api, "acme/aliases/bot", other) == (403, "FORBIDDEN")
    assert _get(api, "nope/aliases/bot", other) == (403, "FORBIDDEN")
    assert _get(api, "nope/aliases/bot", api.admin) == (404, "NOT_FOUND")
    assert _get(api, "acme/aliases/never", reader) == (404, "NOT_FOUND")
    assert _get(api, "acme/aliases/old", reader) == (410, "ALIAS_RETIRED")
    assert _get(api, "acme/aliases/bot", reader) == (200, "")

    token_id = api.client.post("/v1/tokens", headers=api.admin, json={
        "name": "short-lived", "grants": [{"namespace": "acme", "role": "read"}]}).json()
    revocable = {"Authorization": f"Bearer {token_id['token']}"}
    assert _get(api, "acme/aliases/bot", revocable) == (200, "")
    assert api.client.delete(f"/v1/tokens/{token_id['id']}", headers=api.admin).status_code == 200
    assert _get(api, "acme/aliases/bot", revocable) == (401, "UNAUTHENTICATED")


def test_reads_survive_connections_the_server_dropped(pg_url: str, tmp_path: Path,
                                                      assets: Assets) -> None:
    """The read pools ping nothing on checkout: a pooled connection the server killed
    (a restart, an idle timeout) fails its statement, and the read is retried once on
    a fresh connection, so no client sees the drop (the threadpool pool of
    authentication and the event-loop pool of resolve alike)."""
    import psycopg
    from cp_helpers import bootstrap_token, close_app, make_settings
    from fastapi.testclient import TestClient
    from sqlalchemy import func, select

    from controlplane.app import create_app
    from controlplane.kit.async_reads import CompiledRead

    settings = make_settings(pg_url, tmp_path / "var")
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    try:
        with TestClient(app) as client:
            api = Api(app=app, client=client, settings=settings, admin=admin)
            setup_namespace(api, assets.abi)
            a = push_validated(api, assets, assets.adapter_a)
            assert publish(api, "bot", a["id"]).status_code == 201
            reads = app.state.read_engine
            held = [reads.connect() for _ in range(2)]  # two connections in the read pool
            pids = [c.exec_driver_sql("SELECT pg_backend_pid()").scalar() for c in held]
            for c in held:
                c.close()
            # and the event-loop pool's connection (resolve on Postgres)
            # and every connection of the event-loop pool (resolve on Postgres), which
            # hands its connections out in turn
            backend = CompiledRead(select(func.pg_backend_pid().label("pid")))
            assert client.portal is not None
            seen: set[int] = set()
            for _ in range(200):  # the pool may still be opening a connection under load
                seen.add(client.portal.call(app.state.async_reads.fetch_one, backend, {}).pid)
                if len(seen) >= 2 and len(seen) == app.state.async_reads.pool_size():
                    break
            assert len(seen) == app.state.async_reads.pool_size()
            pids += sorted(seen)
            plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(plain, autocommit=True) as conn:
                for pid in pids:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            for path in ("/v1/namespaces/acme/aliases/bot", "/v1/namespaces"):
                r = client.get(path, headers=admin)
                assert r.status_code == 200, r.text
    finally:
        close_app(app)
