"""Completions' `echo` through a real agent and the official openai client: the prompt's
text before the completion, and with logprobs its tokens' logprobs (first: null) equal to
HF transformers + PEFT log-softmax (fp32) for base and adapter requests; `max_tokens: 0`
scores the prompt alone (what evaluation harnesses send for loglikelihood)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from .conftest import Deployment
from .test_inference_api import client

TOL = 1e-4
PROMPT = [12, 40, 7, 99, 5, 61, 3, 200, 17]


def _model(dep: Deployment, adapter: str | None) -> str:
    return f"{dep.namespace}/{adapter}" if adapter else str(
        dep.agent.state()["served_model_name"])


@pytest.mark.parametrize("adapter", [None, "a"])
def test_echo_scores_the_prompt_like_hf_peft(deployment: Deployment, reference: Any,
                                             adapter: str | None) -> None:
    out = client(deployment).completions.create(
        model=_model(deployment, adapter), prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    choice = out.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.token_logprobs) == len(PROMPT) and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    want = reference.log_softmax(PROMPT[:1], PROMPT[1:], adapter)  # row j scores token j + 1
    for j, token in enumerate(PROMPT[1:]):
        assert abs(lp.token_logprobs[j + 1] - float(want[j, token])) < TOL
        shown = list(lp.top_logprobs[j + 1].values())
        assert abs(max(shown) - float(want[j].max())) < TOL
    if adapter is not None:  # the adapter changes the scores: the test has teeth
        base = reference.log_softmax(PROMPT[:1], PROMPT[1:], None)
        assert (base - want).abs().max() > 1e-3
    assert choice.model_extra["token_ids"] == [] and choice.text == "".join(lp.tokens or [])
    assert out.usage is not None and out.usage.completion_tokens == 0
    assert out.usage.prompt_tokens == len(PROMPT)


def test_echo_with_a_completion_and_streamed(deployment: Deployment, reference: Any) -> None:
    model = _model(deployment, "c")
    out = client(deployment).completions.create(
        model=model, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1,
        extra_body={"ignore_eos": True})
    choice = out.choices[0]
    generated = reference.greedy(PROMPT, 3, "c")
    assert choice.model_extra["token_ids"] == generated
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.tokens is not None
    assert len(lp.token_logprobs) == len(PROMPT) + 3
    gen_lp = reference.log_softmax(PROMPT, generated, "c")
    for i, token in enumerate(generated):
        assert abs(lp.token_logprobs[len(PROMPT) + i] - float(gen_lp[i, token])) < TOL
    assert choice.text == "".join(lp.tokens)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]

    chunks = list(client(deployment).completions.create(
        model=model, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1,
        stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs
                for v in (c.choices[0].logprobs.token_logprobs or [])]
    assert streamed == lp.token_logprobs


def test_echo_without_logprobs_and_with_n(deployment: Deployment) -> None:
    model = _model(deployment, "b")
    plain = client(deployment).completions.create(
        model=model, prompt="hello there", max_tokens=2, temperature=0, echo=True,
        extra_body={"ignore_eos": True})
    assert plain.choices[0].text.startswith("hello there")
    assert plain.choices[0].logprobs is None
    two = client(deployment).completions.create(
        model=model, prompt=PROMPT, max_tokens=2, temperature=1.0, seed=4, n=2, echo=True,
        logprobs=0, extra_body={"ignore_eos": True})
    heads = [c.logprobs.token_logprobs[:len(PROMPT)] for c in two.choices]  # type: ignore[union-attr,index]
    assert heads[0] == heads[1] and heads[0][0] is None and None not in heads[0][1:]


def test_chat_echo_and_max_tokens_zero_without_echo_are_refused(deployment: Deployment) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client(deployment).chat.completions.create(
            model=_model(deployment, "a"), messages=[{"role": "user", "content": "hi"}],
            max_tokens=2, extra_body={"echo": True})
    assert (err.value.code, err.value.param) == ("UNSUPPORTED_PARAMETER", "echo")
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client(deployment).completions.create(model=_model(deployment, "a"), prompt=PROMPT,
                                              max_tokens=0)
    assert err.value.code == "VALIDATION_ERROR"
