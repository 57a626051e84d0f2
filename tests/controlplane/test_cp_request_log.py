"""Request logging: one structlog JSON line per request with its X-Request-ID, no
secrets in any line, and unhandled exceptions become 500 with the one error body."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cp_helpers import Api

from controlplane.kit.request_log import REDACTED, redact_secrets


def _lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def test_each_request_is_one_json_line_with_its_id(api: Api,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    created = api.client.post("/v1/tokens", headers=api.admin, json={
        "name": "reader", "grants": [{"namespace": "*", "role": "read"}]})
    token = created.json()["token"]
    mine = api.client.get("/v1/bases?limit=2", headers={
        "Authorization": f"Bearer {token}", "X-Request-ID": "ci-run.42"})
    forged = api.client.get("/v1/namespaces/acme/aliases/x", headers={
        "Authorization": f"Bearer {token}x", "X-Request-ID": "bad id\twith spaces"})
    assert mine.headers["x-request-id"] == "ci-run.42"
    assert forged.status_code == 401
    fresh = forged.headers["x-request-id"]
    assert fresh != "bad id\twith spaces" and len(fresh) == 32

    err = capsys.readouterr().err
    lines = [e for e in _lines(err) if e["event"] == "request"]
    by_id = {e["request_id"]: e for e in lines}
    assert by_id["ci-run.42"]["status"] == 200
    assert by_id["ci-run.42"]["path"] == "/v1/bases"  # the query string is not logged
    assert by_id[fresh]["status"] == 401 and by_id[fresh]["method"] == "GET"
    assert {"timestamp", "level", "duration_ms"} <= set(by_id[fresh])
    admin_token = api.admin["Authorization"].removeprefix("Bearer ")
    assert token not in err and admin_token not in err


def test_unhandled_exception_is_500_with_the_error_body(
        api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    def boom() -> None:
        raise RuntimeError("kaboom")

    api.app.router.add_api_route("/test-only/boom", boom)
    r = api.client.get("/test-only/boom", headers={"X-Request-ID": "boom-1"})
    assert r.status_code == 500
    assert r.json() == {"error": "internal server error", "code": "INTERNAL_ERROR",
                        "detail": {"request_id": "boom-1"}}
    assert r.headers["x-request-id"] == "boom-1"
    failed = [e for e in _lines(capsys.readouterr().err) if e["event"] == "request.failed"]
    assert len(failed) == 1 and failed[0]["request_id"] == "boom-1"
    assert "RuntimeError: kaboom" in failed[0]["exception"]


def test_redaction_of_credential_keys_and_token_values() -> None:
    token = "ap_" + "x" * 43
    event = redact_secrets(None, "info", {
        "event": f"login with {token} failed", "authorization": "Bearer abc",
        "api_token": "anything", "path": "/v1/bases", "count": 3})
    assert event == {"event": f"login with {REDACTED} failed", "authorization": REDACTED,
                     "api_token": REDACTED, "path": "/v1/bases", "count": 3}
