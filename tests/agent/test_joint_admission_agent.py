"""Joint KV + adapter admission through a real agent process ("fill with KV, then request
a cold adapter"): a base-model request holds nearly every page of the
agent's unified pool as KV; a request for a cold adapter then waits (never runs on the
base model) until that KV is released, and is served by its adapter."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import openai
import pytest

from .assets import GreedyReference
from .conftest import Deployment, extra_agent
from .stack import AgentProcess
from .test_hotswap_and_faults import wait_generation

PAGES = 17
"""Pool pages (= KV blocks of 16 tokens): the long request takes 15-16 of them. The 2 left
after its prefill, less the 1 page it may still grow into, cannot hold adapter d's 2 pages:
neither placement's prefetch (which leaves running requests' growth free) nor the
request can load d while it runs. With one page more the prefetch fits, and the request
then finds d resident and runs beside the long one."""
LONG_PROMPT = [(11 * i) % 250 + 3 for i in range(225)]


@pytest.fixture(scope="module")
def small_pool_agent(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[AgentProcess]:
    with extra_agent(deployment, tmp_path_factory, "agent-small-pool",
                     {"ADAPTERPLANE_AGENT_NUM_KV_BLOCKS": str(PAGES),
                      "ADAPTERPLANE_AGENT_FAULT_STEP_DELAY_S": "0.4"}) as agent:
        yield agent


def test_cold_adapter_waits_for_kv_then_serves(deployment: Deployment,
                                               small_pool_agent: AgentProcess,
                                               reference: GreedyReference) -> None:
    ns, token, arts = deployment.namespace, deployment.reader_token, deployment.artifacts
    client = openai.OpenAI(base_url=f"{small_pool_agent.url}/v1", api_key=token,
                           max_retries=0, timeout=120.0)
    base = small_pool_agent.state()["served_model_name"]
    long = client.completions.create(model=base, prompt=LONG_PROMPT, max_tokens=30,
                                     temperature=0, stream=True,
                                     extra_body={"ignore_eos": True})
    assert next(iter(long)).choices  # prefilled: 15 of 18 pages are its KV
    # published only now: neither placement's prefetch nor the request can load it (PAGES)
    deployment.admin.publish(ns, "joint", arts["d"]["id"])
    wait_generation(small_pool_agent, token, f"{ns}/joint", 1)
    digest = arts["d"]["digest"]
    result: list[object] = []

    def cold() -> None:
        try:
            result.append(client.completions.create(
                model=f"{ns}/joint", prompt=[21, 22, 23], max_tokens=4, temperature=0,
                extra_body={"ignore_eos": True}))
        except openai.APIError as exc:
            result.append(exc)

    thread = threading.Thread(target=cold)
    thread.start()
    # admission cannot fit d (+ its KV) beside the live request: it waits, unserved
    state = small_pool_agent.wait_for(lambda s: s["live"] == 1 and any(
        x["artifact_digest"] == digest and x["state"] == "loading" and x["waiting"] == 1
        for x in s["slots"]) and not result)
    pages = state["pool"]["pages"]
    assert pages["kv"] >= 15 and pages["reserved"] == 0 and sum(pages.values()) == PAGES
    long.close()  # the long request ends: its KV returns to the pool
    thread.join(timeout=60)
    assert len(result) == 1 and not isinstance(result[0], Exception), result
    res = result[0]
    assert isinstance(res, openai.types.Completion)
    assert (res.model_extra or {})["adapterplane"]["artifact_digest"] == digest
    got = (res.choices[0].model_extra or {})["token_ids"]
    assert got == reference.greedy([21, 22, 23], 4, "d") != reference.greedy([21, 22, 23], 4,
                                                                            None)
    final = small_pool_agent.wait_for(lambda s: s["live"] == 0)
    assert final["pool"]["pages"]["reserved"] == 0
