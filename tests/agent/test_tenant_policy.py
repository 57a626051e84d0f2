"""Tenant policy end to end: a namespace weight/priority PATCH on the control plane
reaches the running agent process (its desired-state long-poll wakes on the change) and
its engine; `/v1/agent/state` shows every tenant's policy and completed service, which
grows with the requests the namespace's aliases serve (the base model's tenant is "")."""

from __future__ import annotations

import time
from typing import Any

import openai

from .conftest import Deployment

MAX_TOKENS = 4


def _complete(dep: Deployment, model: str) -> Any:
    client = openai.OpenAI(base_url=f"{dep.agent.url}/v1", api_key=dep.reader_token,
                           max_retries=0, timeout=60.0)
    return client.completions.create(model=model, prompt=[5, 17, 42, 99], temperature=0,
                                     max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})


def _tenant(state: dict[str, Any], ns: str) -> dict[str, Any]:
    return dict(state.get("tenants", {}).get(ns, {}))


def test_patch_reaches_the_agent_engine(deployment: Deployment) -> None:
    ns, agent, admin = deployment.namespace, deployment.agent, deployment.admin
    agent.wait_for(lambda s: bool(s.get("ready")))
    assert _tenant(agent.state(), ns)["weight"] == 1.0  # the default, from desired state
    try:
        started = time.monotonic()
        admin.call("PATCH", f"/v1/namespaces/{ns}", json={"weight": 6.5, "priority": "high"})
        state = agent.wait_for(lambda s: _tenant(s, ns).get("weight") == 6.5, timeout_s=30)
        elapsed = time.monotonic() - started
        assert _tenant(state, ns)["priority"] == "high"
        # the agent's long-poll waits 5 s; the change woke it (a generous bound)
        assert elapsed < 4.5, elapsed

        served_before = _tenant(state, ns)["completed_service"]
        out = _complete(deployment, f"{ns}/a")
        assert out.usage is not None and out.usage.completion_tokens == MAX_TOKENS
        state = agent.wait_for(
            lambda s: _tenant(s, ns).get("completed_service", 0) > served_before)
        # the request's tenant is its alias's namespace: it got the namespace's service
        assert _tenant(state, ns)["completed_service"] >= MAX_TOKENS

        _complete(deployment, str(state["served_model_name"]))  # the base model's tenant ""
        base = agent.wait_for(lambda s: _tenant(s, "").get("completed_service", 0) > 0)
        assert _tenant(base, "")["weight"] == 1.0 and _tenant(base, "")["priority"] == "normal"

        admin.call("PATCH", f"/v1/namespaces/{ns}", json={"priority": "low"})
        state = agent.wait_for(lambda s: _tenant(s, ns).get("priority") == "low", timeout_s=30)
        assert _tenant(state, ns)["weight"] == 6.5
    finally:  # the deployment is shared by the package's other tests
        admin.call("PATCH", f"/v1/namespaces/{ns}", json={"weight": 1, "priority": "normal"})
        agent.wait_for(lambda s: _tenant(s, ns).get("priority") == "normal", timeout_s=30)
