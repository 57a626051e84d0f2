"""Hotswap, rollback, overload and crash recovery against a second, slowed agent.

The agent here sleeps before every engine step (`fault_step_delay_s`), so a long
request is provably still running while the alias is republished: the test checks the
agent's own state for the old generation's held slot rather than trusting timing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from .assets import GreedyReference
from .conftest import Deployment, extra_agent
from .stack import AgentProcess
from .test_inference_api import prompts

LONG = 200
MAX_LIVE = 4


@pytest.fixture(scope="module")
def slow_agent(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[AgentProcess]:
    with extra_agent(deployment, tmp_path_factory, "agent-1",
                     {"ADAPTERPLANE_AGENT_FAULT_STEP_DELAY_S": "0.03",
                      "ADAPTERPLANE_AGENT_MAX_QUEUED_REQUESTS": str(MAX_LIVE)}) as agent:
        yield agent


def oai(agent: AgentProcess, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{agent.url}/v1", api_key=token, max_retries=0,
                         timeout=120.0)


def binding_of(agent: AgentProcess, token: str, model: str) -> dict[str, Any] | None:
    data = httpx.get(f"{agent.url}/v1/models", timeout=10,
                     headers={"Authorization": f"Bearer {token}"}).json()["data"]
    found = [m for m in data if m["id"] == model]
    return found[0]["adapterplane"] if found else None


def wait_generation(agent: AgentProcess, token: str, model: str, generation: int) -> None:
    agent.wait_for(lambda _s: (binding_of(agent, token, model) or {}).get("generation")
                   == generation)


def slot_refcount(agent: AgentProcess, digest: str) -> int:
    return sum(s["refcount"] for s in agent.state()["slots"]
               if s["artifact_digest"] == digest)


def test_republish_mid_stream_and_rollback_never_mix_adapters(
        deployment: Deployment, slow_agent: AgentProcess, reference: GreedyReference) -> None:
    ns, token, arts = deployment.namespace, deployment.reader_token, deployment.artifacts
    model = f"{ns}/swap"
    deployment.admin.publish(ns, "swap", arts["a"]["id"])
    wait_generation(slow_agent, token, model, 1)
    by_generation = {1: "a"}
    long_prompt = [11, 12, 13]
    stream = oai(slow_agent, token).completions.create(
        model=model, prompt=long_prompt, max_tokens=LONG, temperature=0, stream=True,
        extra_body={"ignore_eos": True})
    chunks = [next(iter(stream))]  # the old request is admitted and has produced a token
    checked: list[tuple[int, list[int], list[int]]] = []
    stop = threading.Event()

    def hammer(seed: int) -> None:
        for prompt in prompts(40, seed):
            if stop.is_set():
                return
            res = oai(slow_agent, token).completions.create(
                model=model, prompt=prompt, max_tokens=3, temperature=0,
                extra_body={"ignore_eos": True})
            gen = res.model_extra["adapterplane"]["generation"]
            checked.append((gen, prompt, res.choices[0].model_extra["token_ids"]))

    with ThreadPoolExecutor(max_workers=2) as pool:
        workers = [pool.submit(hammer, s) for s in (1, 2)]
        assert deployment.admin.publish(ns, "swap", arts["d"]["id"]) == 2
        by_generation[2] = "d"
        wait_generation(slow_agent, token, model, 2)
        new = oai(slow_agent, token).completions.create(
            model=model, prompt=[21, 22], max_tokens=4, temperature=0,
            extra_body={"ignore_eos": True})
        assert new.model_extra["adapterplane"] == {
            "namespace": ns, "alias": "swap", "generation": 2,
            "artifact_digest": arts["d"]["digest"]}
        assert new.choices[0].model_extra["token_ids"] == reference.greedy([21, 22], 4, "d")
        # the old request still holds generation 1's slot while generation 2 serves
        assert slot_refcount(slow_agent, arts["a"]["digest"]) >= 1
        assert deployment.admin.rollback(ns, "swap") == 3
        by_generation[3] = "a"
        wait_generation(slow_agent, token, model, 3)
        stop.set()
        for w in workers:
            w.result()
    chunks += list(stream)
    old_tokens = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
    assert {c.model_extra["adapterplane"]["generation"] for c in chunks} == {1}
    assert old_tokens == reference.greedy(long_prompt, LONG, "a")
    assert checked
    wrong = [(g, p) for g, p, toks in checked
             if toks != reference.greedy(p, 3, by_generation[g])]
    assert wrong == []
    pinned = oai(slow_agent, token).completions.create(
        model=f"{model}@2", prompt=[21, 22], max_tokens=4, temperature=0,
        extra_body={"ignore_eos": True})
    assert pinned.model_extra["adapterplane"]["generation"] == 2
    assert pinned.choices[0].model_extra["token_ids"] == reference.greedy([21, 22], 4, "d")


def test_overload_is_429(deployment: Deployment, slow_agent: AgentProcess) -> None:
    ns, token = deployment.namespace, deployment.reader_token
    streams = [oai(slow_agent, token).completions.create(
        model=f"{ns}/a", prompt=[5, 6], max_tokens=LONG, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) for _ in range(MAX_LIVE)]
    firsts = [next(iter(s)) for s in streams]
    assert all(f.choices for f in firsts)
    slow_agent.wait_for(lambda s: s["live"] == MAX_LIVE)
    with pytest.raises(openai.RateLimitError) as err:
        oai(slow_agent, token).completions.create(model=f"{ns}/a", prompt=[5], max_tokens=1)
    assert err.value.response.json()["error"]["code"] == "OVERLOADED"
    for s in streams:
        s.close()
    slow_agent.wait_for(lambda s: s["live"] == 0)


def test_agent_killed_mid_load_restarts_and_rederives_state(
        deployment: Deployment, slow_agent: AgentProcess, reference: GreedyReference) -> None:
    ns, token, arts = deployment.namespace, deployment.reader_token, deployment.artifacts
    cp_agents = {a["name"]: a for a in deployment.admin.call("GET", "/v1/agents")}
    epoch_before = cp_agents["agent-1"]["worker_epoch"]
    slow_agent.stop()
    slow_agent.start({"fault_delay_load_s": "60"})
    deployment.admin.publish(ns, "cold", arts["b"]["id"])
    wait_generation(slow_agent, token, f"{ns}/cold", 1)
    outcome: list[object] = []

    def request() -> None:
        try:
            outcome.append(oai(slow_agent, token).completions.create(
                model=f"{ns}/cold", prompt=[7, 8, 9], max_tokens=4, temperature=0))
        except openai.APIError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    slow_agent.wait_for(lambda s: any(x["artifact_digest"] == arts["b"]["digest"]
                                      and x["state"] == "loading" for x in s["slots"]))
    slow_agent.kill()
    thread.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], openai.APIConnectionError)
    slow_agent.start({"fault_delay_load_s": "0"})
    state = slow_agent.state()
    assert state["worker_epoch"] == epoch_before + 2
    res = oai(slow_agent, token).completions.create(
        model=f"{ns}/cold", prompt=[7, 8, 9], max_tokens=4, temperature=0,
        extra_body={"ignore_eos": True})
    assert res.model_extra["adapterplane"]["artifact_digest"] == arts["b"]["digest"]
    assert res.choices[0].model_extra["token_ids"] == reference.greedy([7, 8, 9], 4, "b")
    cp_agents = {a["name"]: a for a in deployment.admin.call("GET", "/v1/agents")}
    assert cp_agents["agent-1"]["worker_epoch"] == epoch_before + 2


def test_demo_steps_show_hotswap_and_rollback(deployment: Deployment,
                                              slow_agent: AgentProcess) -> None:
    from agent.demo import complete_each, show_hotswap

    ns, token, arts = deployment.namespace, deployment.reader_token, deployment.artifacts
    deployment.admin.publish(ns, "demo", arts["a"]["id"])
    wait_generation(slow_agent, token, f"{ns}/demo", 1)
    lines: list[str] = []
    done = complete_each(slow_agent.url, token, [f"{ns}/demo", f"{ns}/b"], "hi", lines.append,
                         max_tokens=2)
    assert [d["ran_on"]["generation"] for d in done] == [1, 1]
    steps = show_hotswap(slow_agent, token, deployment.cp.url, deployment.cp.token(), ns,
                         "demo", str(arts["d"]["id"]), "hello", lines.append, max_tokens=40)
    assert steps["in_flight"]["generation"] == 1
    assert steps["publish"]["generation"] == 2
    assert steps["publish"]["artifact_digest"] == arts["d"]["digest"]
    assert steps["rollback"]["generation"] == 3
    assert steps["rollback"]["artifact_digest"] == arts["a"]["digest"]
    assert steps["in_flight_finished_on"] == [1]
    assert len(lines) == 8


def test_a_newer_process_fences_the_old_one(deployment: Deployment, slow_agent: AgentProcess,
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    """Same agent name started again: the control plane hands out a newer epoch, the old
    process's next heartbeat is refused (409 STALE_EPOCH) and it stops serving."""
    epoch = slow_agent.state()["worker_epoch"]
    newer = AgentProcess(tmp_path_factory.mktemp("agent-1b") / "agent.log", slow_agent.env)
    newer.start()
    try:
        assert newer.state()["worker_epoch"] == epoch + 1
        assert slow_agent.proc is not None
        assert slow_agent.proc.wait(timeout=60) == 0
        ns, token = deployment.namespace, deployment.reader_token
        res = oai(newer, token).completions.create(model=f"{ns}/a", prompt=[1, 2], max_tokens=1)
        assert res.model_extra["adapterplane"]["generation"] == 1
    finally:
        newer.stop()
