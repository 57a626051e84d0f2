"""Agent-side steps of the README demo (`adapterplane demo` wires them in).

Given a running control plane with published aliases:

* :func:`start_demo_agent` creates an agent token and a read token through the admin
  API and starts an agent process on the base model;
* :func:`complete_each` sends one completion per alias through the official `openai`
  client and returns what each ran on (generation, artifact digest) and its text;
* :func:`show_hotswap` starts a streaming request, republishes the alias while it is
  in flight, sends a new request (it binds the new generation), rolls back, sends
  another (it binds the rollback generation), and lets the first finish on the
  generation it was admitted under. After each new request it reads the agent's live
  request count (`steps["live_after_publish"]`, `steps["live_after_rollback"]`): at
  least 1 there shows the first request was still running across the swap.

`say` receives one human-readable line per event (the demo prints them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agent.supervisor import AgentProcess

Say = Callable[[str], None]


def _admin(cp_url: str, admin_token: str) -> httpx.Client:
    return httpx.Client(base_url=cp_url, timeout=30.0,
                        headers={"Authorization": f"Bearer {admin_token}"})


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.method} {response.request.url.path}: "
                           f"{response.status_code} {response.text}")
    body: dict[str, Any] = response.json()
    return body


def start_demo_agent(cp_url: str, admin_token: str, model_dir: Path, work_dir: Path,
                     namespace: str, *, name: str = "demo-agent",
                     **settings: str) -> tuple[AgentProcess, str]:
    """Start an agent for `model_dir`; returns it and a token with read on `namespace`."""
    with _admin(cp_url, admin_token) as admin:
        agent_token = _check(admin.post("/v1/tokens", json={
            "name": name, "grants": [], "is_agent": True}))["token"]
        reader = _check(admin.post("/v1/tokens", json={
            "name": f"{name}-client", "grants": [{"namespace": namespace, "role": "read"}],
            "is_agent": False}))["token"]
    env = {"ADAPTERPLANE_AGENT_CONTROL_PLANE_URL": cp_url,
           "ADAPTERPLANE_AGENT_TOKEN": agent_token, "ADAPTERPLANE_AGENT_NAME": name,
           "ADAPTERPLANE_AGENT_MODEL_DIR": str(model_dir),
           "ADAPTERPLANE_AGENT_CACHE_DIR": str(work_dir / "agent-cache")}
    agent = AgentProcess(work_dir / "logs" / "agent.log", env)
    agent.start(settings)
    return agent, str(reader)


def _client(agent_url: str, token: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{agent_url}/v1", api_key=token, max_retries=0,
                         timeout=300.0)


def _ran_on(response: Any) -> dict[str, Any] | None:
    extra: dict[str, Any] = response.model_extra or {}
    binding: dict[str, Any] | None = extra.get("adapterplane")
    return binding


def _label(binding: dict[str, Any] | None) -> str:
    if binding is None:
        return "base model"
    return f"generation {binding['generation']} (artifact {binding['artifact_digest'][:12]})"


def complete_each(agent_url: str, token: str, models: list[str], prompt: str,
                  say: Say, max_tokens: int = 24) -> list[dict[str, Any]]:
    """One greedy completion per model; returns `{model, ran_on, text}` per model."""
    client = _client(agent_url, token)
    results = []
    for model in models:
        res = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                        temperature=0)
        binding = _ran_on(res)
        say(f"{model}: {_label(binding)} -> {res.choices[0].text!r}")
        results.append({"model": model, "ran_on": binding, "text": res.choices[0].text})
    return results


def show_hotswap(agent: AgentProcess, token: str, cp_url: str, admin_token: str,
                 namespace: str, alias: str, new_artifact: str, prompt: str, say: Say,
                 max_tokens: int = 64) -> dict[str, Any]:
    """Republish and roll back while a request is in flight (see module docstring)."""
    model = f"{namespace}/{alias}"
    client = _client(agent.url, token)
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True)
    chunks = [next(iter(stream))]
    old = _ran_on(chunks[0])
    say(f"in flight: {model} admitted on {_label(old)}")
    steps: dict[str, Any] = {"in_flight": old}
    with _admin(cp_url, admin_token) as admin:
        for action, body in (("publish", {"artifact": new_artifact}), ("rollback", {})):
            gen = _check(admin.post(f"/v1/namespaces/{namespace}/aliases/{alias}/{action}",
                                    json={**body, "reason": f"demo {action}"}))["generation"]
            say(f"{action}: {model} is now generation {gen}")
            _wait_generation(agent, token, model, int(gen))
            res = client.completions.create(model=model, prompt=prompt, max_tokens=8,
                                            temperature=0)
            steps[action] = _ran_on(res)
            live = int(agent.state().get("live", 0))
            steps[f"live_after_{action}"] = live
            say(f"new request after {action}: {_label(steps[action])}; "
                f"{live} request(s) still in flight on the agent")
    chunks += list(stream)
    finished = sorted({int((_ran_on(c) or {}).get("generation", 0)) for c in chunks})
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    say(f"in-flight request finished on generation(s) {finished}: {text!r}")
    steps["in_flight_finished_on"] = finished
    return steps


def _wait_generation(agent: AgentProcess, token: str, model: str, generation: int) -> None:
    def applied(_state: dict[str, Any]) -> bool:
        return _current(agent, token, model) == generation

    agent.wait_for(applied, timeout_s=30)


def _current(agent: AgentProcess, token: str, model: str) -> int | None:
    data = httpx.get(f"{agent.url}/v1/models", timeout=10,
                     headers={"Authorization": f"Bearer {token}"}).json()["data"]
    for m in data:
        if m["id"] == model and m.get("adapterplane"):
            return int(m["adapterplane"]["generation"])
    return None
