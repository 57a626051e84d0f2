"""Request limits through a real agent process: a `max_tokens` above the agent's limit or
beyond the context after the prompt is 422 naming the field, and a non-streaming request
whose client disconnects stops generating at once (it would otherwise run to max_tokens)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from .conftest import Deployment, extra_agent

STEP_S = 0.05


def test_max_tokens_limits_and_disconnect_abort(
        deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> None:
    env = {"ADAPTERPLANE_AGENT_MAX_TOKENS_LIMIT": "150",
           "ADAPTERPLANE_AGENT_FAULT_STEP_DELAY_S": str(STEP_S)}
    model = f"{deployment.namespace}/a"
    with extra_agent(deployment, tmp_path_factory, "agent-limits", env) as agent:
        agent.wait_for(lambda s: bool(s.get("ready")))
        client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=deployment.reader_token,
                               max_retries=0, timeout=60.0)
        for tokens, prompt, word in ((151, [5, 6], "limit"), (150, [7] * 120, "context")):
            with pytest.raises(openai.UnprocessableEntityError) as err:
                client.completions.create(model=model, prompt=prompt, max_tokens=tokens)
            assert err.value.param == "max_tokens" and word in err.value.message
        assert agent.state()["live"] == 0
        ok = client.completions.create(model=model, prompt=[5, 6], max_tokens=3,
                                       extra_body={"ignore_eos": True})
        assert ok.usage is not None and ok.usage.completion_tokens == 3

        # 120 tokens at >= 50 ms a step: >= 6 s if the abandoned request ran to its end
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{agent.url}/v1/completions", timeout=httpx.Timeout(30, read=1.0),
                       headers={"Authorization": f"Bearer {deployment.reader_token}"},
                       json={"model": model, "prompt": [9, 8, 7], "max_tokens": 120,
                             "ignore_eos": True})
        agent.wait_for(lambda s: s["live"] == 0, timeout_s=20)
        assert time.monotonic() - started < 120 * STEP_S * 0.6
