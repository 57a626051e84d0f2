"""Drain of a real agent process: drained over REST (with the agent's own token, as a
Kubernetes preStop hook would), the agent hears it in its heartbeat answer and turns
`/readyz` 503 `draining`, keeps serving what still reaches it, lets an in-flight
streaming request run to its end, then reports `drained`; `adapterctl agents drain NAME
--wait` returns once it has. Undrained, it is ready again.

A slowed agent of its own (a sleep before every engine step) keeps the stream in flight
for seconds; the test publishes nothing (it uses the deployment's alias `a`).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from .conftest import Deployment, extra_agent

NAME = "agent-drain"
STEP_DELAY_S = 0.05
STREAM_TOKENS = 100
"""At STEP_DELAY_S per step, about five seconds in flight."""


def _stream(url: str, token: str, model: str, out: dict[str, Any]) -> None:
    chunks = 0
    try:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=60,
                          headers={"Authorization": f"Bearer {token}"},
                          json={"model": model, "prompt": [4, 5, 6], "stream": True,
                                "max_tokens": STREAM_TOKENS, "temperature": 0,
                                "ignore_eos": True}) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: "):
                    chunks += 1
                    out.setdefault("first_at", time.monotonic())
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    out["chunks"] = chunks
    out["ended_at"] = time.monotonic()


def _ready(url: str) -> tuple[int, dict[str, Any]]:
    r = httpx.get(f"{url}/readyz", timeout=5)
    return r.status_code, dict(r.json())


def _until(predicate: Any, what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_drain_a_real_agent(deployment: Deployment,
                            tmp_path_factory: pytest.TempPathFactory) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    model = f"{deployment.namespace}/a"
    cli_env = {"ADAPTERPLANE_URL": deployment.cp.url,
               "ADAPTERPLANE_TOKEN": deployment.cp.token()}
    with extra_agent(deployment, tmp_path_factory, NAME,
                     {"ADAPTERPLANE_AGENT_FAULT_STEP_DELAY_S": str(STEP_DELAY_S)}) as agent:
        (me,) = deployment.admin.call("GET", "/v1/agents", params={"name": NAME})
        assert me["state"] == "live" and me["drain"] is False
        assert me["capabilities"]["served_model_name"] == "agent-tiny"  # registered name

        def shown() -> dict[str, Any]:
            return dict(deployment.admin.call("GET", f"/v1/agents/{me['id']}"))

        agent_api = httpx.Client(base_url=deployment.cp.url, timeout=10,
                                 headers={"Authorization": f"Bearer {deployment.agent_token}"})
        try:
            # the heartbeat reports the KV pool
            _until(lambda: shown()["load"]["pool_pages"] > 0, "a load report")

            out: dict[str, Any] = {}
            stream = threading.Thread(target=_stream, daemon=True,
                                      args=(agent.url, deployment.reader_token, model, out))
            stream.start()
            _until(lambda: "first_at" in out, "the stream's first token")
            _until(lambda: shown()["load"]["live_requests"] >= 1, "a live request reported")
            assert shown()["state"] == "live"

            r = agent_api.post(f"/v1/agents/{me['id']}/drain")  # the agent's own token
            assert r.status_code == 200, r.text
            assert r.json()["state"] == "draining"
            _until(lambda: _ready(agent.url) == (503, {"status": "draining"}),
                   "/readyz draining")
            assert agent.state()["draining"] is True
            assert "ended_at" not in out, "the stream ended before the drain was seen"
            now = shown()
            assert (now["state"], now["drained"]) == ("draining", False)

            # a request that still reaches the agent directly is served
            direct = httpx.post(f"{agent.url}/v1/completions", timeout=60,
                                headers={"Authorization": f"Bearer {deployment.reader_token}"},
                                json={"model": model, "prompt": [7, 8], "max_tokens": 2,
                                      "temperature": 0})
            assert direct.status_code == 200, direct.text

            result = CliRunner().invoke(app, ["-o", "json", "agents", "drain", NAME,
                                              "--wait", "--timeout", "60"],
                                        env=cli_env, catch_exceptions=False)
            returned = time.monotonic()
            assert result.exit_code == 0, result.output
            stream.join(timeout=30)
            assert out.get("status") == 200 and out.get("done") is True, out
            assert out["chunks"] >= STREAM_TOKENS // 2, out  # ran to its end, not cut
            assert out["ended_at"] <= returned  # --wait returned after the last request
            assert returned - out["ended_at"] < 5, "drained reported late"
            drained = json.loads(result.stdout)
            assert (drained["state"], drained["drain"], drained["drained"]) == (
                "drained", True, True)
            assert drained["load"]["live_requests"] == 0
            assert _ready(agent.url) == (503, {"status": "draining"})

            undone = CliRunner().invoke(app, ["-o", "json", "agents", "undrain", NAME],
                                        env=cli_env, catch_exceptions=False)
            assert undone.exit_code == 0, undone.output
            assert json.loads(undone.stdout)["state"] == "live"
            _until(lambda: _ready(agent.url) == (200, {"status": "ready"}), "ready again")
            assert agent.state()["draining"] is False
            again = httpx.post(f"{agent.url}/v1/completions", timeout=60,
                               headers={"Authorization": f"Bearer {deployment.reader_token}"},
                               json={"model": model, "prompt": [7, 8], "max_tokens": 2,
                                     "temperature": 0})
            assert again.status_code == 200, again.text
        finally:
            # whatever happened, the name is not left draining for other tests
            agent_api.post(f"/v1/agents/{me['id']}/undrain")
            agent_api.close()
