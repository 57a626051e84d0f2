"""Collection members served natively through an agent process.

Two real PEFT adapters are fitted into a lossless collection by the control plane's
worker; each member is pushed as an artifact and published under its own alias. An agent
with collection blocks (engine residency, or the unified pool) finds the link in its
desired state, downloads the bundle, checks the member's factors against it and serves
each alias from the shared bases: greedy tokens equal HF + PEFT on the source adapters,
and `/v1/agent/state` names the collection for both slots. The deployment's ordinary
agent serves the same aliases as plain LoRAs with the same tokens; an artifact without a
link (alias `a`) stays a plain LoRA on the native agent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from dataplane.assets import make_peft_adapter

from .assets import GreedyReference
from .conftest import AgentAssets, Deployment, extra_agent
from .stack import Admin, AgentProcess

PROMPTS = [[7, 8, 9], [3, 141, 59, 26]]
TARGETS = ["q_proj", "v_proj", "down_proj"]


def _wait(admin: Admin, path: str, done: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    doc = admin.call("GET", path)
    while doc["state"] not in done:
        assert time.monotonic() < deadline, doc
        time.sleep(0.2)
        doc = admin.call("GET", path)
    return dict(doc)


@pytest.fixture(scope="module")
def members(deployment: Deployment, agent_assets: AgentAssets,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("native-sources")
    sources = [make_peft_adapter(agent_assets.base, root / f"s{i}", seed=70 + i, rank=3,
                                 alpha=6, target_modules=TARGETS) for i in range(2)]
    admin, ns = deployment.admin, deployment.namespace
    pushed = [admin.push(ns, deployment.h_base, s) for s in sources]
    fit = admin.call("POST", f"/v1/namespaces/{ns}/collections", json={
        "name": "native-pair", "base": deployment.h_base, "rank": 6,
        "sources": [p["id"] for p in pushed], "max_relative_error": "1/100000"})
    fit = _wait(admin, f"/v1/namespaces/{ns}/collections/{fit['id']}", ("fitted", "rejected"))
    assert fit["state"] == "fitted", fit
    artifacts = []
    for i in range(2):
        art = admin.call("POST", f"/v1/namespaces/{ns}/collections/{fit['id']}/members/{i}"
                                 "/artifact")
        art = _wait(admin, f"/v1/namespaces/{ns}/artifacts/{art['id']}",
                    ("validated", "rejected"))
        assert art["state"] == "validated", art
        admin.publish(ns, f"native-m{i}", art["id"])
        artifacts.append(art)
    return {"sources": sources, "collection": fit, "artifacts": artifacts}


@pytest.fixture(scope="module")
def native_agent(deployment: Deployment, members: dict[str, Any],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """An agent with collection blocks (members take slots of their own above the unified
    pool's)."""
    with extra_agent(deployment, tmp_path_factory, "agent-native", {
            "ADAPTERPLANE_AGENT_COLLECTION_BLOCKS": "2",
            "ADAPTERPLANE_AGENT_COLLECTION_RANK": "8"}) as agent:
        yield agent


def _greedy(agent: AgentProcess, token: str, model: str, prompt: list[int]) -> list[int]:
    client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=token, max_retries=0,
                           timeout=60.0)
    out = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    extra = out.choices[0].model_extra or {}
    return [int(t) for t in extra["token_ids"]]


def _slot(agent: AgentProcess, digest: str) -> dict[str, Any]:
    state = agent.wait_for(lambda s: any(
        x["artifact_digest"] == digest and x["state"] in ("active", "idle") for x in s["slots"]))
    return next(x for x in state["slots"] if x["artifact_digest"] == digest)


def test_members_are_served_from_their_collection(
        deployment: Deployment, agent_assets: AgentAssets, members: dict[str, Any],
        native_agent: AgentProcess) -> None:
    ns, token = deployment.namespace, deployment.reader_token
    reference = GreedyReference(agent_assets.base,
                                {f"s{i}": p for i, p in enumerate(members["sources"])})
    digests = [a["digest"] for a in members["artifacts"]]
    for i, d in enumerate(digests):
        for prompt in PROMPTS:
            want = reference.greedy(prompt, 6, f"s{i}")
            assert _greedy(native_agent, token, f"{ns}/native-m{i}", prompt) == want
            assert _greedy(deployment.agent, token, f"{ns}/native-m{i}", prompt) == want
        native = _slot(native_agent, d)
        assert native["collection"] == members["collection"]["digest"], native
        plain = _slot(deployment.agent, d)  # same artifact as a plain LoRA (pool kernels)
        assert plain["collection"] is None
        assert native["kernel_local"] and plain["kernel_local"]
        assert native["kernel_local"] != plain["kernel_local"]
    # the control plane hears it through the heartbeat (`adapterctl agents show`)
    coll = members["collection"]["digest"]
    name = native_agent.env["ADAPTERPLANE_AGENT_NAME"]
    native_agent.wait_for(lambda _s: set(digests) <= {
        x["artifact_digest"] for x in {a["name"]: a for a in deployment.admin.call(
            "GET", "/v1/agents")}[name]["slots"] if x.get("collection") == coll},
        timeout_s=15)
    metrics = httpx.get(f"{native_agent.url}/metrics", timeout=10).text
    assert 'adapter_collection_blocks{state="used"} 1.0' in metrics
    assert 'adapter_collection_blocks{state="free"} 1.0' in metrics
    members_line = next(line for line in metrics.splitlines()
                        if line.startswith("adapter_collection_members "))
    assert float(members_line.split()[1]) >= 1
    # an artifact that materialises no member stays an ordinary LoRA on this agent
    plain_a = GreedyReference(agent_assets.base, {"a": agent_assets.adapters["a"]})
    assert _greedy(native_agent, token, f"{ns}/a", PROMPTS[0]) == plain_a.greedy(
        PROMPTS[0], 6, "a")
    assert _slot(native_agent, deployment.artifacts["a"]["digest"])["collection"] is None
