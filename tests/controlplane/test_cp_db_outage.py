"""An unreachable database is a retryable 503 DATABASE_UNAVAILABLE with `Retry-After`,
on every path a request can take to it: the auth gate (a body-carrying request), a
route's own authentication, the resolve hot path. The app points at a loopback port
nothing listens on (the shared Postgres is never touched)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cp_helpers import close_app, free_port, make_settings
from fastapi.testclient import TestClient

from controlplane.app import create_app

TOKEN = {"Authorization": "Bearer ap_" + "x" * 43}


@pytest.fixture
def dead_db_client(tmp_path: Path) -> Iterator[TestClient]:
    url = f"postgresql+psycopg://adapterplane:adapterplane@127.0.0.1:{free_port()}/nothing"
    app = create_app(make_settings(url, tmp_path / "var"))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    close_app(app)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/namespaces", None),
    ("POST", "/v1/namespaces", {"name": "acme"}),
    ("GET", "/v1/namespaces/acme/aliases/bot", None),
    ("POST", "/v1/namespaces/acme/aliases/bot/publish", {"artifact": "1"}),
])
def test_database_outage_is_a_retryable_503(dead_db_client: TestClient, method: str,
                                            path: str, body: object) -> None:
    r = dead_db_client.request(method, path, headers=TOKEN, json=body)
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "DATABASE_UNAVAILABLE"
    assert int(r.headers["retry-after"]) > 0
    assert "127.0.0.1" not in r.text and "adapterplane" not in r.json()["error"]
