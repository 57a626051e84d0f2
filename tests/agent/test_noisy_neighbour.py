"""A flooding namespace does not starve a quiet one, end to end through a real agent
process and the official openai client.

An agent that runs two sequences at a time (`MAX_NUM_SEQS=2`) under each scheduling
policy. Namespace "flood" sends 24 concurrent requests of 48 tokens; once they run (and
queue), namespace "quiet" sends 3 of 12. Every request completes. Under `fair` each quiet
request is admitted at one of the next free sequences (its tenant has the least completed
service), so all three finish before most of the flood; under `fcfs` they wait behind the
whole flood.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import openai
import pytest

from .conftest import AgentAssets, Deployment, extra_agent

FLOOD, QUIET = 24, 3
TOKENS = {"f": 48, "q": 12}


@pytest.fixture(scope="module")
def two_namespaces(deployment: Deployment, agent_assets: AgentAssets
                   ) -> Iterator[tuple[str, str, str]]:
    """(flood namespace, quiet namespace, a token reading both): each with alias "m"."""
    admin = deployment.admin
    names = []
    for role in ("flood", "quiet"):
        ns = f"{role}-{uuid.uuid4().hex[:6]}"
        admin.call("POST", "/v1/namespaces", json={"name": ns})
        adapter = agent_assets.adapters["a" if role == "flood" else "b"]
        artifact = admin.push(ns, deployment.h_base, adapter)
        admin.publish(ns, "m", artifact["id"])
        names.append(ns)
    token = admin.token(f"reader-{uuid.uuid4().hex[:6]}",
                        [{"namespace": ns, "role": "read"} for ns in names])
    yield names[0], names[1], token


def _finish_order(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory,
                  names: tuple[str, str, str], policy: str) -> list[str]:
    flood, quiet, token = names
    env = {"ADAPTERPLANE_AGENT_MAX_NUM_SEQS": "2",
           "ADAPTERPLANE_AGENT_SCHEDULING_POLICY": policy}
    with extra_agent(deployment, tmp_path_factory, f"agent-{policy}", env) as agent:
        agent.wait_for(lambda s: bool(s.get("ready")) and {flood, quiet} <= set(
            s.get("tenants", {})), timeout_s=60)
        client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=token, max_retries=0,
                               timeout=120.0)
        done: list[str] = []

        def ask(tag: str, ns: str, i: int) -> None:
            tokens = TOKENS[tag[0]]
            out = client.completions.create(model=f"{ns}/m", prompt=[5, 17, 42, 99 + i],
                                            temperature=0, max_tokens=tokens,
                                            extra_body={"ignore_eos": True})
            assert out.usage is not None and out.usage.completion_tokens == tokens
            done.append(tag)

        with ThreadPoolExecutor(FLOOD + QUIET) as pool:
            futures: list[Future[None]] = [pool.submit(ask, f"f{i}", flood, i)
                                           for i in range(FLOOD)]
            # the flood runs (and queues behind its two running sequences)
            agent.wait_for(lambda s: s.get("tenants", {}).get(flood, {}).get(
                "completed_service", 0) > 0, timeout_s=60)
            futures += [pool.submit(ask, f"q{i}", quiet, i) for i in range(QUIET)]
            for f in futures:
                f.result(timeout=300)
        state = agent.state()
        assert state["tenants"][quiet]["completed_service"] > 0
        return done


def test_fair_policy_serves_the_quiet_namespace_first(
        deployment: Deployment, two_namespaces: tuple[str, str, str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    fair = _finish_order(deployment, tmp_path_factory, two_namespaces, "fair")
    fcfs = _finish_order(deployment, tmp_path_factory, two_namespaces, "fcfs")
    for order in (fair, fcfs):
        assert sorted(order) == sorted([f"f{i}" for i in range(FLOOD)]
                                       + [f"q{i}" for i in range(QUIET)])
    quiet_fair = [i for i, tag in enumerate(fair) if tag.startswith("q")]
    quiet_fcfs = [i for i, tag in enumerate(fcfs) if tag.startswith("q")]
    assert max(quiet_fair) < FLOOD // 2, fair
    assert min(quiet_fcfs) > FLOOD // 2, fcfs
