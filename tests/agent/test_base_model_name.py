"""The agent serves the bare base under the name it was registered with on the control
plane (not its model directory's name), and a `model` that names nothing served is a
422 that lists the valid names."""

from __future__ import annotations

import httpx

from .conftest import Deployment

REGISTERED = "agent-tiny"
"""The name tests/agent/conftest.py registers the base under (its directory: tiny-base)."""


def _post(dep: Deployment, model: str) -> httpx.Response:
    return httpx.post(f"{dep.agent.url}/v1/completions", timeout=60.0,
                      headers={"Authorization": f"Bearer {dep.reader_token}"},
                      json={"model": model, "prompt": [5, 6, 7], "max_tokens": 2,
                            "temperature": 0})


def test_base_is_served_under_its_registered_name(deployment: Deployment) -> None:
    assert deployment.agent_env["ADAPTERPLANE_AGENT_MODEL_DIR"].endswith("/tiny-base")
    models = httpx.get(f"{deployment.agent.url}/v1/models", timeout=10.0,
                       headers={"Authorization": f"Bearer {deployment.reader_token}"})
    assert models.status_code == 200, models.text
    assert models.json()["data"][0]["id"] == REGISTERED
    answer = _post(deployment, REGISTERED)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == REGISTERED
    assert answer.json().get("adapterplane") is None  # the base model, no adapter


def test_a_wrong_base_name_lists_the_valid_names(deployment: Deployment) -> None:
    refused = _post(deployment, "tiny-base")  # the directory's name
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and error["param"] == "model"
    assert f"'{REGISTERED}'" in error["message"]
    assert "'namespace/alias'" in error["message"]
    assert error["detail"]["base_models"] == [REGISTERED]
