"""Queue deadlines end to end through a real agent process and the openai client: a
request that cannot start within its `max_queue_ms` gets 503 QUEUE_TIMEOUT with a
Retry-After header and nothing generated; an agent over its live-request limit answers 429
with Retry-After; `/v1/agent/state` keeps the offered / admitted / expired ledger."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from .conftest import Deployment, extra_agent


def test_a_request_that_cannot_start_in_time_gets_503_with_retry_after(
        deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> None:
    env = {"ADAPTERPLANE_AGENT_MAX_NUM_SEQS": "1", "ADAPTERPLANE_AGENT_FAULT_STEP_DELAY_S": "0.02",
           "ADAPTERPLANE_AGENT_MAX_QUEUED_REQUESTS": "3"}
    ns = deployment.namespace
    with extra_agent(deployment, tmp_path_factory, "agent-deadline", env) as agent:
        agent.wait_for(lambda s: bool(s.get("ready")))
        client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=deployment.reader_token,
                               max_retries=0, timeout=120.0)

        def ask(tokens: int, **extra: object) -> object:
            return client.completions.create(
                model=f"{ns}/a", prompt=[5, 17, 42, 99], temperature=0, max_tokens=tokens,
                extra_body={"ignore_eos": True, **extra})

        with ThreadPoolExecutor(4) as pool:
            long = pool.submit(ask, 40)  # 40 steps of >= 20 ms hold the one sequence
            agent.wait_for(lambda s: s.get("admission", {}).get("admitted", 0) >= 1)
            late = pool.submit(ask, 4, max_queue_ms=150)
            with pytest.raises(openai.APIStatusError) as refused:
                late.result(timeout=60)
            assert long.result(timeout=60).usage.completion_tokens == 40  # type: ignore[attr-defined]
        err = refused.value
        assert err.status_code == 503
        assert err.response.json()["error"]["code"] == "QUEUE_TIMEOUT"
        assert int(err.response.headers["Retry-After"]) >= 1
        state = agent.state()
        assert state["admission"]["expired"] >= 1
        assert state["admission"]["offered"] == state["admission"]["admitted"] + \
            state["admission"]["expired"]
        metrics = httpx.get(f"{agent.url}/metrics", timeout=10).text
        assert 'adapter_requests_rejected_total{reason="queue_timeout"} 1.0' in metrics
        expired = [line for line in metrics.splitlines()
                   if line.startswith('adapter_engine_requests_total{outcome="expired"}')]
        assert expired and float(expired[0].split()[-1]) == state["admission"]["expired"]

        with ThreadPoolExecutor(6) as pool:  # over MAX_QUEUED_REQUESTS: 429 with Retry-After
            futures = [pool.submit(ask, 30) for _ in range(6)]
            statuses = []
            for f in futures:
                try:
                    f.result(timeout=120)
                    statuses.append(200)
                except openai.APIStatusError as exc:
                    statuses.append(exc.status_code)
                    assert exc.status_code == 429
                    assert int(exc.response.headers["Retry-After"]) >= 1
        assert 429 in statuses and 200 in statuses
