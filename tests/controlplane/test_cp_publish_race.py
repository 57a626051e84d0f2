"""20 concurrent publishers over real HTTP, each with its own connection, all sending
the same expected generation: exactly one 201, nineteen 409, gapless generations,
one audit row per generation. On Postgres (row lock) and SQLite (BEGIN IMMEDIATE)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
from cp_helpers import Assets, LiveServer, bootstrap_token, close_app, make_settings, push_dir

from controlplane.app import create_app

PUBLISHERS = 20


def race(url: str, headers: dict[str, str], alias: str, artifact: int,
         expected: int) -> list[httpx.Response]:
    barrier = threading.Barrier(PUBLISHERS)
    results: list[Any] = [None] * PUBLISHERS

    def run(i: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            barrier.wait()
            results[i] = client.post(f"/v1/namespaces/acme/aliases/{alias}/publish", json={
                "artifact": str(artifact), "expected_generation": expected,
                "reason": f"publisher {i}"})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(PUBLISHERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_publishers(database_url: str, tmp_path: Path, assets: Assets) -> None:
    settings = make_settings(database_url, tmp_path / "var", database_pool_size=PUBLISHERS)
    app = create_app(settings)
    headers = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    try:
        with LiveServer(app) as server, httpx.Client(base_url=server.url, headers=headers,
                                                     timeout=60) as client:
            client.post("/v1/bases", json={"name": "tiny", "abi": assets.abi})
            client.post("/v1/namespaces", json={"name": "acme"})
            a = push_dir(client, headers, "acme", assets.h_base, assets.adapter_a).json()["id"]
            b = push_dir(client, headers, "acme", assets.h_base, assets.adapter_b).json()["id"]

            # a brand-new alias (expected 0), then an existing one (expected 1)
            for expected, artifact in ((0, a), (1, b)):
                results = race(server.url, headers, "bot", artifact, expected)
                codes = sorted(r.status_code for r in results)
                assert codes == [201] + [409] * (PUBLISHERS - 1), [r.text for r in results]
                assert {r.json()["code"] for r in results if r.status_code == 409} == {
                    "GENERATION_CONFLICT"}
                winner = next(r for r in results if r.status_code == 201)
                assert winner.json()["generation"] == expected + 1

            hist = client.get("/v1/namespaces/acme/aliases/bot/history").json()["items"]
            assert [g["generation"] for g in hist] == [2, 1]
            assert [g["artifact"]["id"] for g in hist] == [b, a]
            audit = client.get("/v1/audit?namespace=acme&limit=500").json()["items"]
            publishes = [e for e in audit if e["action"] == "catalog.publish"]
            assert sorted(e["detail"]["generation"] for e in publishes) == [1, 2]
            assert {e["detail"]["reason"] for e in publishes} == {
                g["reason"] for g in hist}
    finally:
        close_app(app)


def test_postgres_notifies_committed_generations(pg_url: str, tmp_path: Path,
                                                 assets: Assets) -> None:
    """Listeners hear of each committed generation (and of nothing rolled back)."""
    import json

    import psycopg
    from cp_helpers import Api, setup_namespace
    from fastapi.testclient import TestClient

    from controlplane.catalog.service import CATALOG_CHANNEL

    settings = make_settings(pg_url, tmp_path / "var")
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
    try:
        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute(f"LISTEN {CATALOG_CHANNEL}")
            client = TestClient(app)
            setup_namespace(Api(app=app, client=client, settings=settings, admin=admin),
                            assets.abi)
            art = push_dir(client, admin, "acme", assets.h_base, assets.adapter_a).json()["id"]
            pub = "/v1/namespaces/acme/aliases/bot/publish"
            assert client.post(pub, headers=admin, json={"artifact": str(art)}).is_success
            conflict = client.post(pub, headers=admin, json={"artifact": str(art),
                                                             "expected_generation": 0})
            assert conflict.status_code == 409
            assert client.post("/v1/namespaces/acme/aliases/bot/retire", headers=admin,
                               json={}).is_success
            got = [json.loads(n.payload) for n in listener.notifies(timeout=5, stop_after=2)]
        assert got == [{"namespace": "acme", "alias": "bot", "generation": 1},
                       {"namespace": "acme", "alias": "bot", "generation": 2}]
    finally:
        close_app(app)


def test_concurrent_pushes_of_the_same_bytes(pg_url: str, tmp_path: Path,
                                             assets: Assets) -> None:
    """Same files, same base, same namespace, at once: one artifact, one 202, one audit row."""
    settings = make_settings(pg_url, tmp_path / "var", database_pool_size=10)
    app = create_app(settings)
    headers = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    pushers = 6
    try:
        with LiveServer(app) as server:
            with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
                client.post("/v1/bases", json={"name": "tiny", "abi": assets.abi})
                client.post("/v1/namespaces", json={"name": "acme"})
            barrier = threading.Barrier(pushers)
            results: list[Any] = [None] * pushers

            def run(i: int) -> None:
                with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
                    barrier.wait()
                    results[i] = push_dir(client, headers, "acme", assets.h_base,
                                          assets.adapter_a)

            threads = [threading.Thread(target=run, args=(i,)) for i in range(pushers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(r.status_code for r in results) == [200] * (pushers - 1) + [202]
            assert len({r.json()["id"] for r in results}) == 1
            with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
                audit = client.get("/v1/audit").json()["items"]
        assert [e["action"] for e in audit].count("artifact.push") == 1
    finally:
        close_app(app)
