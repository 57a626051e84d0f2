"""Property test of the whole admin API against its own OpenAPI document (schemathesis).

Every operation in `/openapi.json` gets `EXAMPLES` generated requests that fit its
schema and `EXAMPLES` that violate it (hypothesis, derandomised so a failure
reproduces), sent in-process over ASGI to a real app on Postgres, with a valid admin
token, after seeding one base, one namespace and one validated, published alias so
that lookups can hit real rows. Properties checked on every response:

- every schemathesis response check (`CHECKS`): no 5xx; the status code, content type,
  headers and body are the ones the operation documents; schema-violating requests
  are refused; a 405 names the allowed methods; a request without its token is refused;
- every 4xx body is exactly the one error shape `{error: str, code: STABLE_CODE,
  detail: object}`;
- the same requests without a token are 401 UNAUTHENTICATED (a schema-violating one may
  be 422 VALIDATION_ERROR first), except on the public health routes.

`s3://` imports go to the session's moto server (a missing bucket must be a 4xx,
not a storage fault).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from cp_helpers import Assets, bootstrap_token, close_app, make_settings, push_dir
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation.modes import GenerationMode

from controlplane.app import create_app

CODE = re.compile(r"[A-Z][A-Z0-9_]*")
ADMIN: dict[str, str] = {}
EXAMPLES = 10
"""Per operation and mode (valid / schema-violating requests)."""
PUBLIC = frozenset({"/healthz", "/readyz"})
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance, negative_data_rejection,
          allow_header_conformance, missing_required_header, ignored_auth]


@pytest.fixture
def api_schema(pg_url: str, tmp_path: Path, assets: Assets,
               s3_endpoint: str) -> Iterator[Any]:
    app = create_app(make_settings(pg_url, tmp_path / "var", s3_endpoint_url=s3_endpoint,
                                   s3_access_key_id="testing",
                                   s3_secret_access_key="testing"))
    ADMIN["Authorization"] = f"Bearer {bootstrap_token(app.state.settings)}"
    with TestClient(app) as client:
        assert client.post("/v1/bases", headers=ADMIN,
                           json={"name": "tiny", "abi": assets.abi}).status_code == 201
        assert client.post("/v1/namespaces", headers=ADMIN,
                           json={"name": "acme"}).status_code == 201
        art = push_dir(client, ADMIN, "acme", assets.h_base, assets.adapter_a).json()["id"]
        assert client.post("/v1/namespaces/acme/aliases/bot/publish", headers=ADMIN,
                           json={"artifact": str(art)}).status_code == 201
        yield schemathesis.openapi.from_asgi("/openapi.json", app)
    close_app(app)


def _check_error_body(response: Any) -> None:
    if response.status_code < 400:
        return
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error", "code", "detail"}, body
    assert isinstance(body["error"], str) and isinstance(body["detail"], dict), body
    assert CODE.fullmatch(body["code"]), body


def test_every_check_and_one_error_body(api_schema: Any) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 18
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode)
            except Unsatisfiable:  # nothing in this operation can violate its schema
                assert mode is GenerationMode.NEGATIVE, operation.label


def _fuzz(operation: Any, mode: GenerationMode) -> None:
    anonymous_refusals = {401, 422} if mode is GenerationMode.NEGATIVE else {401}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        response = case.call(headers=ADMIN)
        case.validate_response(response, checks=CHECKS, headers=ADMIN)
        _check_error_body(response)
        if case.path in PUBLIC:
            return
        anonymous = case.call()
        assert anonymous.status_code in anonymous_refusals, (case.path, anonymous.text)
        _check_error_body(anonymous)

    check()
