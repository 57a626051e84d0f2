"""Injected load faults through real agent processes (`ADAPTERPLANE_FAULTS`).

`faulty_agent` (fresh download cache, one attempt per load: no retry) fails the first
artifact download, the first pool copy (after one page was written), the first
validation, and *every* publication: each request for an adapter gets a typed 503
`ADAPTER_LOAD_FAILED`, never base-model output; every failure is reported (agent state,
control plane) and counted by stage in /metrics, and the pool ends with nothing
published, reserved or staged (retries: test_load_retry.py). `delayed_agent` slows
every phase instead: requests are served by their adapter (HF + PEFT reference) and
nothing fails.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from .assets import GreedyReference
from .conftest import Deployment, extra_agent
from .stack import AgentProcess

PROMPT = [7, 8, 9]
FAULTS = "download=fail,copy=fail@1,validate=fail,publish=fail*0"
STAGES = ("download", "copy", "validate", "publish")


@pytest.fixture(scope="module")
def faulty_agent(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[AgentProcess]:
    with extra_agent(deployment, tmp_path_factory, "agent-faults",
                     {"ADAPTERPLANE_FAULTS": FAULTS,
                      "ADAPTERPLANE_AGENT_LOAD_ATTEMPTS": "1"}) as agent:
        yield agent


def failures_by_stage(agent: AgentProcess) -> dict[str, float]:
    text = httpx.get(f"{agent.url}/metrics", timeout=10).text
    found = re.findall(r'^adapter_load_failures_total\{stage="(\w+)"\} ([0-9.]+)$', text, re.M)
    return {stage: float(n) for stage, n in found}


def test_each_load_fault_gives_a_typed_error_and_leaks_nothing(
        deployment: Deployment, faulty_agent: AgentProcess) -> None:
    ns, token = deployment.namespace, deployment.reader_token
    client = openai.OpenAI(base_url=f"{faulty_agent.url}/v1", api_key=token, max_retries=0,
                           timeout=60.0)
    for name in ("a", "b", "c"):
        for _attempt in range(len(STAGES)):  # each attempt is a fresh load that fails
            with pytest.raises(openai.APIStatusError) as err:
                client.completions.create(model=f"{ns}/{name}", prompt=PROMPT, max_tokens=4,
                                          temperature=0, extra_body={"ignore_eos": True})
            assert err.value.status_code == 503, err.value.response.text
            assert err.value.response.json()["error"]["code"] == "ADAPTER_LOAD_FAILED"
    counted = failures_by_stage(faulty_agent)
    assert [counted.get(s, 0.0) for s in STAGES[:3]] == [1.0, 1.0, 1.0], counted
    assert counted.get("publish", 0.0) >= 1, counted  # requests may share a load
    state = faulty_agent.wait_for(lambda s: s["live"] == 0)
    assert set(STAGES) <= {f["stage"] for f in state["load_failures"]}
    pool = state["pool"]
    pages = pool["pages"]  # conservation over the one KV + adapter page ledger:
    assert sum(pages.values()) == int(deployment.agent_env["ADAPTERPLANE_AGENT_NUM_KV_BLOCKS"])
    assert pages["adapter"] == pages["reserved"] == 0
    assert pool["slots"]["published"] == pool["slots"]["staging"] == 0
    assert not [s for s in state["slots"] if s["state"] in ("active", "idle")]
    assert all(n == 0 for n in pool["residency"].values())
    # the control plane hears of the failures through the heartbeat
    faulty_agent.wait_for(lambda _s: set(STAGES) <= {
        f["stage"] for f in {a["name"]: a for a in deployment.admin.call("GET", "/v1/agents")}
        ["agent-faults"]["load_failures"]}, timeout_s=15)


@pytest.fixture(scope="module")
def delayed_agent(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[AgentProcess]:
    with extra_agent(deployment, tmp_path_factory, "agent-delays",
                     {"ADAPTERPLANE_FAULTS": "download=delay:0.2*0,copy=delay:0.2*0,"
                      "validate=delay:0.2*0,publish=delay:0.2*0"}) as agent:
        yield agent


def test_delayed_load_phases_still_serve_the_right_adapter(
        deployment: Deployment, delayed_agent: AgentProcess, reference: GreedyReference) -> None:
    """Every download, copy (an event that completes only when waited on), validation
    and publication is slow: requests wait for the one complete publication and never
    run on the base model or a half-loaded slot; nothing fails."""
    ns, token = deployment.namespace, deployment.reader_token
    client = openai.OpenAI(base_url=f"{delayed_agent.url}/v1", api_key=token, max_retries=0,
                           timeout=60.0)
    for name in ("a", "c"):
        res = client.completions.create(model=f"{ns}/{name}", prompt=PROMPT, max_tokens=4,
                                        temperature=0, extra_body={"ignore_eos": True})
        assert (res.choices[0].model_extra or {})["token_ids"] == \
            reference.greedy(PROMPT, 4, name)
    state = delayed_agent.wait_for(lambda s: s["live"] == 0)
    assert state["load_failures"] == [] and failures_by_stage(delayed_agent) == {}
    assert state["pool"]["pages"]["reserved"] == 0 and state["pool"]["slots"]["staging"] == 0
