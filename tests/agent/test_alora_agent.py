"""An activated LoRA end to end: pushed, validated and published through the control
plane, served by a real agent process, called with the official openai client.

A prompt that invokes it answers as PEFT's aLoRA does; one that does not is refused with
422 ALORA_NOT_INVOKED (or, asked for explicitly, answered by the base model); and an
aLoRA request on a conversation the base model just served reports the shared base prefix
as cached prompt tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from dataplane.assets import make_peft_adapter

from .assets import GreedyReference
from .conftest import AgentAssets, Deployment
from .test_inference_api import client

INVOKE = [40, 41, 42]
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def alora(deployment: Deployment, agent_assets: AgentAssets,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The aLoRA published as `intrinsic` for this module; retired afterwards, and gone
    from the agent's slots, so the shared deployment's other tests see their own set."""
    path = make_peft_adapter(agent_assets.base, tmp_path_factory.mktemp("alora") / "alora",
                             seed=31, rank=8, alpha=16, delta_scale=1.0,
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"],
                             alora_invocation_tokens=INVOKE)
    ns = deployment.namespace
    art = deployment.admin.push(ns, deployment.h_base, path)
    assert art["validated_record"]["alora_invocation_tokens"] == INVOKE
    deployment.admin.publish(ns, "intrinsic", art["id"])
    yield f"{ns}/intrinsic", path
    deployment.admin.retire(ns, "intrinsic")
    deployment.agent.wait_for(lambda s: all(x["artifact_digest"] != art["digest"]
                                            for x in s["slots"]), timeout_s=60)


def _complete(dep: Deployment, model: str, prompt: list[int], **extra: object) -> object:
    return client(dep).completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                          temperature=0,
                                          extra_body={"ignore_eos": True, **extra})


def test_an_invoked_alora_answers_like_peft(deployment: Deployment, agent_assets: AgentAssets,
                                            alora: tuple[str, Path]) -> None:
    model, path = alora
    reference = GreedyReference(agent_assets.base, {"intrinsic": path})
    conversation = [7 + (i * 37) % 200 for i in range(30)]
    base_name = str(deployment.agent.state()["served_model_name"])
    base = _complete(deployment, base_name, conversation)
    assert base.choices[0].model_extra["token_ids"] == reference.greedy(  # type: ignore[attr-defined]
        conversation, MAX_TOKENS, None)
    prompt = [*conversation, *INVOKE]
    out = _complete(deployment, model, prompt)
    assert out.choices[0].model_extra["token_ids"] == reference.greedy(  # type: ignore[attr-defined]
        prompt, MAX_TOKENS, "intrinsic")
    assert out.choices[0].model_extra["token_ids"] != reference.greedy(  # type: ignore[attr-defined]
        prompt, MAX_TOKENS, None)  # the adapter changes the answer: the test has teeth
    # the base request left the conversation's full blocks; the aLoRA's rows before its
    # invocation are base rows, so it reuses them
    cached = out.usage.prompt_tokens_details.cached_tokens  # type: ignore[attr-defined]
    assert 0 < cached <= len(conversation)
    # /metrics counts those tokens as base execution an aLoRA reused
    assert _prompt_tokens(deployment, "cached_base_for_alora") >= cached


def _prompt_tokens(dep: Deployment, source: str) -> float:
    text = httpx.get(f"{dep.agent.url}/metrics", timeout=10).text
    line = f'prefix_cache_prompt_tokens_total{{source="{source}"}} '
    values = [float(row[len(line):]) for row in text.splitlines() if row.startswith(line)]
    return values[0] if values else 0.0


def test_a_prompt_without_the_invocation_is_refused_unless_base_is_asked_for(
        deployment: Deployment, agent_assets: AgentAssets, alora: tuple[str, Path]) -> None:
    model, path = alora
    prompt = [9, 40, 41, 8, 42, 5]  # the invocation's tokens, never in a row
    enqueued = deployment.agent.state()["events"]["events"]["queue_enqueued"]
    with pytest.raises(openai.UnprocessableEntityError) as err:
        _complete(deployment, model, prompt)
    assert err.value.response.json()["error"]["code"] == "ALORA_NOT_INVOKED"
    # refused at admission: it never queued (nor waited for a load)
    assert deployment.agent.state()["events"]["events"]["queue_enqueued"] == enqueued
    out = _complete(deployment, model, prompt, alora_base_if_not_invoked=True)
    reference = GreedyReference(agent_assets.base, {"intrinsic": path})
    assert out.choices[0].model_extra["token_ids"] == reference.greedy(  # type: ignore[attr-defined]
        prompt, MAX_TOKENS, None)
