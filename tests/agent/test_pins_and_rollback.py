"""Pins to any catalog generation are served, and a rollback finds its adapter warm.

The agent's desired state carries only an alias's recent generations; a pin
(`ns/alias@N`) to an older one, or to one newer than the agent has heard of, is fetched
from the control plane and served with that generation's own adapter (the tokens equal
the independent reference of that adapter). An adapter superseded by a publish stays in
its slot as `cached`, so rolling back to it starts no new load.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dataplane.assets import make_peft_adapter

from .assets import GreedyReference
from .conftest import AgentAssets, Deployment, extra_agent
from .stack import AgentProcess
from .test_hotswap_and_faults import oai, wait_generation

HISTORY = 8
"""Generations per alias in the agent's desired state (controlplane HISTORY_LIMIT)."""
ALIASES = ("pin", "fresh", "rb")


@pytest.fixture(scope="module", autouse=True)
def _retire_afterwards(deployment: Deployment) -> Iterator[None]:
    """The deployment is shared: its placement must not keep serving these aliases."""
    yield
    for alias in ALIASES:
        deployment.admin.retire(deployment.namespace, alias)


def _complete(dep: Deployment, model: str, prompt: list[int],
              agent: AgentProcess | None = None) -> tuple[list[int], Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}
    r = httpx.post(f"{(agent or dep.agent).url}/v1/completions", json=body, timeout=60,
                   headers={"Authorization": f"Bearer {dep.reader_token}"})
    assert r.status_code == 200, r.text
    doc = r.json()
    return list(doc["choices"][0]["token_ids"]), doc["adapterplane"]


def _slot(agent: AgentProcess, digest: str) -> dict[str, Any] | None:
    return next((s for s in agent.state()["slots"] if s["artifact_digest"] == digest), None)


def test_pins_older_than_the_agents_history_are_served(
        deployment: Deployment, reference: GreedyReference) -> None:
    ns, arts, admin = deployment.namespace, deployment.artifacts, deployment.admin
    names = ["a", "b"] * ((HISTORY + 4) // 2)  # generation g serves names[g - 1]
    for name in names:
        last = admin.publish(ns, "pin", arts[name]["id"])
    assert last == len(names) > HISTORY
    wait_generation(deployment.agent, deployment.reader_token, f"{ns}/pin", last)
    prompt = [5, 6, 7]
    for generation in (1, 2, last - HISTORY, last):
        tokens, binding = _complete(deployment, f"{ns}/pin@{generation}", prompt)
        name = names[generation - 1]
        assert binding["generation"] == generation
        assert binding["artifact_digest"] == arts[name]["digest"]
        assert tokens == reference.greedy(prompt, 4, name), generation
    missing = httpx.post(f"{deployment.agent.url}/v1/completions", timeout=30,
                         headers={"Authorization": f"Bearer {deployment.reader_token}"},
                         json={"model": f"{ns}/pin@{last + 5}", "prompt": prompt,
                               "max_tokens": 1})
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["code"] == "NOT_FOUND"


def test_a_pin_to_a_generation_just_published_is_served(
        deployment: Deployment, reference: GreedyReference) -> None:
    ns, arts, admin = deployment.namespace, deployment.artifacts, deployment.admin
    for i in range(6):
        name = "ab"[i % 2]
        generation = admin.publish(ns, "fresh", arts[name]["id"])
        # asked at once: the agent may not have heard of the generation yet
        tokens, binding = _complete(deployment, f"{ns}/fresh@{generation}", [9, 8])
        assert binding["generation"] == generation
        assert tokens == reference.greedy([9, 8], 4, name)


def test_rollback_is_a_warm_hit(deployment: Deployment, agent_assets: AgentAssets,
                                tmp_path_factory: pytest.TempPathFactory) -> None:
    ns, admin, token = deployment.namespace, deployment.admin, deployment.reader_token
    # an artifact no other alias of the shared deployment names
    path = make_peft_adapter(agent_assets.base, tmp_path_factory.mktemp("rb") / "rb",
                             seed=41, rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    art = admin.push(ns, deployment.h_base, path)
    own = GreedyReference(agent_assets.base, {"rb": path})
    model, digest = f"{ns}/rb", art["digest"]
    with extra_agent(deployment, tmp_path_factory, "agent-roomy",
                     {"ADAPTERPLANE_AGENT_MAX_SLOTS": "6"}) as agent:
        wait_generation(agent, token, model, admin.publish(ns, "rb", art["id"]))
        oai(agent, token).completions.create(model=model, prompt=[1, 2], max_tokens=1)
        loaded = _slot(agent, digest)
        assert loaded is not None and loaded["state"] in ("active", "idle")
        arts = deployment.artifacts
        wait_generation(agent, token, model, admin.publish(ns, "rb", arts["a"]["id"]))
        agent.wait_for(lambda s: any(
            x["artifact_digest"] == digest and x["state"] == "cached" for x in s["slots"]))

        generation = admin.rollback(ns, "rb")
        wait_generation(agent, token, model, generation)
        tokens, binding = _complete(deployment, model, [3, 4, 5], agent)
        assert binding["artifact_digest"] == digest
        assert tokens == own.greedy([3, 4, 5], 4, "rb")
        again = _slot(agent, digest)
        assert again is not None and again["attempt_id"] == loaded["attempt_id"]  # warm
