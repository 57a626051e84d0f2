"""OpenAI sampling controls through a real agent and the official openai client (sync,
async, streamed): logit_bias, presence / frequency / repetition penalties and min_tokens,
against HF transformers + PEFT `generate` with the same adjustments (tests/engine/helpers)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from dataplane.core import SamplingParams
from tests.engine.helpers import hf_generate

from .conftest import Deployment
from .test_inference_api import client

EOS = 2  # the tiny Llama's eos_token_id

CASES: list[tuple[str | None, list[int], dict[str, Any]]] = [
    ("a", [12, 40, 7, 99, 5, 40, 7], {"presence_penalty": 1.5, "frequency_penalty": 0.8}),
    (None, [9, 9, 9, 31, 200], {"frequency_penalty": 2.0}),
    ("c", [3, 141, 59, 26, 53, 59], {"repetition_penalty": 1.7}),
    ("b", [60, 61, 62], {"logit_bias": {"7": 6.0, "200": -100, "11": 3.0}}),
    ("a", [200, 100, 50], {"logit_bias": {str(EOS): 100}, "min_tokens": 4,
                           "ignore_eos": False}),
]


def _params(body: dict[str, Any], max_tokens: int) -> SamplingParams:
    bias = tuple(sorted((int(k), float(v)) for k, v in body.get("logit_bias", {}).items()))
    return SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=body.get("ignore_eos", True),
        min_tokens=body.get("min_tokens", 0), logit_bias=bias,
        presence_penalty=body.get("presence_penalty", 0.0),
        frequency_penalty=body.get("frequency_penalty", 0.0),
        repetition_penalty=body.get("repetition_penalty", 1.0))


def _model(dep: Deployment, adapter: str | None) -> str:
    return f"{dep.namespace}/{adapter}" if adapter else str(
        dep.agent.state()["served_model_name"])


@pytest.mark.parametrize(("adapter", "prompt", "controls"), CASES)
def test_controls_equal_hf_generate(deployment: Deployment, reference: Any,
                                    adapter: str | None, prompt: list[int],
                                    controls: dict[str, Any]) -> None:
    body = {"ignore_eos": True, **controls}
    want = hf_generate(reference.model, prompt, adapter, _params(body, 8), EOS)
    plain = reference.greedy(prompt, 8, adapter)
    assert want != plain[:len(want)]  # the control changes the answer: the test has teeth
    out = client(deployment).completions.create(
        model=_model(deployment, adapter), prompt=prompt, max_tokens=8, temperature=0,
        extra_body=body)
    assert out.choices[0].model_extra["token_ids"] == want
    streamed = list(client(deployment).completions.create(
        model=_model(deployment, adapter), prompt=prompt, max_tokens=8, temperature=0,
        stream=True, extra_body=body))
    assert [t for c in streamed if c.choices for t in c.choices[0].model_extra["token_ids"]
            ] == want


def test_min_tokens_holds_back_eos_then_stops(deployment: Deployment) -> None:
    out = client(deployment).completions.create(
        model=f"{deployment.namespace}/a", prompt=[200, 100, 50], max_tokens=8,
        temperature=0, extra_body={"logit_bias": {str(EOS): 100}, "min_tokens": 4})
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["token_ids"][-1] == EOS and len(choice.model_extra["token_ids"]) == 5


def test_async_chat_client_with_penalties(deployment: Deployment, reference: Any) -> None:
    async def go() -> Any:
        aclient = openai.AsyncOpenAI(base_url=f"{deployment.agent.url}/v1",
                                     api_key=deployment.reader_token, max_retries=0)
        try:
            return await aclient.chat.completions.create(
                model=f"{deployment.namespace}/b", messages=[{"role": "user", "content": "hi"}],
                max_tokens=6, temperature=0, frequency_penalty=2.0, presence_penalty=1.0,
                extra_body={"ignore_eos": True})
        finally:
            await aclient.close()

    out = asyncio.run(go())
    tokens = out.choices[0].model_extra["token_ids"]
    prompt = out.usage.prompt_tokens
    assert len(tokens) == 6 and prompt > 0
    counts = {t: tokens.count(t) for t in tokens}
    assert max(counts.values()) <= 2  # a frequency penalty of 2 keeps the tiny model off loops


@pytest.mark.parametrize(("field", "value"), [
    ("logit_bias", {"abc": 1}), ("logit_bias", {"5": 101}), ("logit_bias", {"256": 1}),
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0),
    ("min_tokens", 9),
])
def test_bad_controls_are_422_naming_the_field(deployment: Deployment, field: str,
                                               value: object) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client(deployment).completions.create(
            model=f"{deployment.namespace}/a", prompt=[5, 6, 7], max_tokens=8,
            extra_body={field: value})
    if field == "min_tokens":  # above max_tokens: refused by the sampling rules
        assert err.value.code == "VALIDATION_ERROR" and "min_tokens" in err.value.message
    else:
        assert err.value.param == field
