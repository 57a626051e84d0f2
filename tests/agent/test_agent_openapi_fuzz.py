"""Property test of a live agent against its own OpenAPI document (schemathesis).

Every operation of the agent's `/openapi.json` gets `EXAMPLES` requests that fit its
schema and `EXAMPLES` that violate it (derandomised), sent over HTTP to the real agent
process of the shared deployment, with a token that may read every namespace (an agent
token), and once more without a token. Checked on every response: no 5xx, documented
status codes, content types, headers and response schemas, schema-violating input
refused, and every refusal is OpenAI's error object with a stable code; without a token
every route but health and metrics is 401 (or 422 for schema-violating input).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation.modes import GenerationMode

from .conftest import Deployment

CODE = re.compile(r"[A-Z][A-Z0-9_]*")
EXAMPLES = 10
PUBLIC = frozenset({"/healthz", "/readyz", "/metrics"})
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]


@pytest.fixture(scope="module")
def agent_schema(deployment: Deployment) -> Any:
    return schemathesis.openapi.from_url(f"{deployment.agent.url}/openapi.json")


def _check_error_body(response: Any) -> None:
    if response.status_code < 400:
        return
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code", "detail"}, body
    assert CODE.fullmatch(error["code"]) and isinstance(error["detail"], dict), body


def test_every_check_and_one_error_object(agent_schema: Any, deployment: Deployment) -> None:
    auth = {"Authorization": f"Bearer {deployment.agent_token}"}
    operations = [result.ok() for result in agent_schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, auth)
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, operation.label


def _fuzz(operation: Any, mode: GenerationMode, auth: dict[str, str]) -> None:
    anonymous_refusals = {401, 422} if mode is GenerationMode.NEGATIVE else {401}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        response = case.call(headers=auth, timeout=60)
        case.validate_response(response, checks=CHECKS, headers=auth)
        _check_error_body(response)
        if case.path in PUBLIC:
            return
        anonymous = case.call(timeout=60)
        assert anonymous.status_code in anonymous_refusals, (case.path, anonymous.text)
        _check_error_body(anonymous)

    check()
