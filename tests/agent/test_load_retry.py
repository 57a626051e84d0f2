"""Adapter-load recovery through real agent processes: a load attempt that fails is rolled
back, and while requests wait for it a new attempt, under a new id, starts after a short
backoff.

Both agents here fail their first pool copy (`ADAPTERPLANE_FAULTS=copy=fail`) and sleep
`LOAD_DELAY_S` inside every load, so the requests sent right away are waiting for the
first attempt whether they or placement's prefetch started it. Their only target role is
`up_proj`, which only this module's adapter adapts, so no other adapter's prefetch can
take the fault. With the default `load_attempts=2` the second attempt serves the
requests (their arrival, not the retry, starts their clocks); with `load_attempts=1` they
get 503 ADAPTER_LOAD_FAILED.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from dataplane.assets import make_peft_adapter

from .assets import GreedyReference
from .conftest import AgentAssets, Deployment, extra_agent
from .stack import AgentProcess

PROMPT = [7, 8, 9]
MAX_TOKENS = 4
ALIAS = "up-retry"
LOAD_DELAY_S = 1.5
DEADLINE_MS = 2250
"""Longer than one attempt, shorter than two: a request with this `max_queue_ms` would
start if a retry restarted its clock, and expires because it does not."""
AGENT_ENV = {"ADAPTERPLANE_FAULTS": "copy=fail",
             "ADAPTERPLANE_AGENT_FAULT_DELAY_LOAD_S": str(LOAD_DELAY_S),
             "ADAPTERPLANE_AGENT_ADAPTER_TARGETS": '["up_proj"]'}


@dataclass(frozen=True)
class UpAdapter:
    digest: str
    reference: GreedyReference

    def attempt_id(self, n: int) -> str:
        return f"load-{self.digest[:12]}-{n}"


@pytest.fixture(scope="module")
def up(deployment: Deployment, agent_assets: AgentAssets,
       tmp_path_factory: pytest.TempPathFactory) -> UpAdapter:
    path = make_peft_adapter(agent_assets.base, tmp_path_factory.mktemp("up") / "up", seed=11,
                             rank=4, alpha=8, target_modules=["up_proj"])
    art = deployment.admin.push(deployment.namespace, deployment.h_base, path)
    deployment.admin.publish(deployment.namespace, ALIAS, art["id"])
    return UpAdapter(art["digest"], GreedyReference(agent_assets.base, {"up": path}))


@pytest.fixture(scope="module")
def retrying_agent(deployment: Deployment, up: UpAdapter,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with extra_agent(deployment, tmp_path_factory, "agent-retry", AGENT_ENV) as agent:
        yield agent


@pytest.fixture(scope="module")
def single_attempt_agent(deployment: Deployment, up: UpAdapter,
                         tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with extra_agent(deployment, tmp_path_factory, "agent-one-attempt",
                     {**AGENT_ENV, "ADAPTERPLANE_AGENT_LOAD_ATTEMPTS": "1"}) as agent:
        yield agent


def complete(agent: AgentProcess, token: str, model: str,
             **extra: Any) -> tuple[float, Any]:
    """(wall time the request was sent, the completion). The client's connection is set up
    by a first call, so the send time is within milliseconds of the agent's arrival."""
    client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=token, max_retries=0,
                           timeout=60.0)
    client.models.list()
    sent_at = time.time()
    return sent_at, client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"ignore_eos": True, **extra})


def metric(agent: AgentProcess, name: str, label: str) -> dict[str, float]:
    text = httpx.get(f"{agent.url}/metrics", timeout=10).text
    found = re.findall(rf'^{name}\{{{label}="(\w+)"\}} ([0-9.e+-]+)$', text, re.M)
    return {value: float(n) for value, n in found}


def attempts_of(state: dict[str, Any], digest: str) -> list[tuple[str, str, bool]]:
    return [(f["attempt_id"], f["stage"], f["retry"]) for f in state["load_failures"]
            if f["artifact"] == digest]


def assert_pool_clean(state: dict[str, Any]) -> None:
    pool = state["pool"]
    assert pool["pages"]["reserved"] == 0 and pool["slots"]["staging"] == 0, pool


def test_a_failed_attempt_is_retried_under_a_new_id_and_serves_the_adapter(
        deployment: Deployment, up: UpAdapter, retrying_agent: AgentProcess) -> None:
    model, token = f"{deployment.namespace}/{ALIAS}", deployment.reader_token
    with ThreadPoolExecutor(max_workers=2) as pool:
        served = pool.submit(complete, retrying_agent, token, model)
        late = pool.submit(complete, retrying_agent, token, model, max_queue_ms=DEADLINE_MS)
        sent_at, res = served.result()
        with pytest.raises(openai.APIStatusError) as err:
            late.result()
    assert err.value.status_code == 503, err.value.response.text
    assert err.value.response.json()["error"]["code"] == "QUEUE_TIMEOUT"
    assert res.model_extra["adapterplane"]["artifact_digest"] == up.digest
    assert res.choices[0].model_extra["token_ids"] == up.reference.greedy(PROMPT, MAX_TOKENS,
                                                                          "up")
    state = retrying_agent.wait_for(lambda s: s["live"] == 0)
    assert attempts_of(state, up.digest) == [(up.attempt_id(1), "copy", True)]
    slots = [s for s in state["slots"] if s["artifact_digest"] == up.digest]
    assert [(s["state"], s["attempt_id"], s["attempts"]) for s in slots] == \
        [("idle", up.attempt_id(2), 2)]
    assert_pool_clean(state)
    assert metric(retrying_agent, "adapter_load_attempts_total", "result") == \
        {"failed": 1.0, "ok": 1.0}
    assert metric(retrying_agent, "adapter_load_failures_total", "stage") == {"copy": 1.0}
    # the clock started at arrival: the first token came after the rest of the failed
    # attempt, the backoff and the whole second attempt (half of it is slack for timing;
    # a clock restarted by the retry would count about one attempt)
    failed_at = next(f["at"] for f in state["load_failures"] if f["artifact"] == up.digest)
    ttft = metric(retrying_agent, "adapter_ttft_seconds_sum", "residency")["cold"]
    assert ttft >= (failed_at - sent_at) + LOAD_DELAY_S / 2, (ttft, failed_at - sent_at)


def test_with_one_attempt_the_waiters_get_load_failed(
        deployment: Deployment, up: UpAdapter, single_attempt_agent: AgentProcess) -> None:
    model, token = f"{deployment.namespace}/{ALIAS}", deployment.reader_token
    with pytest.raises(openai.APIStatusError) as err:
        complete(single_attempt_agent, token, model)
    assert err.value.status_code == 503, err.value.response.text
    assert err.value.response.json()["error"]["code"] == "ADAPTER_LOAD_FAILED"
    state = single_attempt_agent.wait_for(lambda s: s["live"] == 0)
    assert attempts_of(state, up.digest) == [(up.attempt_id(1), "copy", False)]
    assert not [s for s in state["slots"] if s["artifact_digest"] == up.digest]
    assert_pool_clean(state)
    assert metric(single_attempt_agent, "adapter_load_attempts_total", "result") == \
        {"failed": 1.0}
    # the next request is a new load whose attempt numbers go on (ids are never reused)
    _, res = complete(single_attempt_agent, token, model)
    assert res.choices[0].model_extra["token_ids"] == up.reference.greedy(PROMPT, MAX_TOKENS,
                                                                          "up")
    state = single_attempt_agent.wait_for(lambda s: s["live"] == 0)
    assert [s["attempt_id"] for s in state["slots"] if s["artifact_digest"] == up.digest] \
        == [up.attempt_id(2)]
    assert metric(single_attempt_agent, "adapter_load_attempts_total", "result") == \
        {"failed": 1.0, "ok": 1.0}
