"""OpenAI logprobs through a real agent and the official openai client: completions'
`logprobs: k` and chat's `logprobs` / `top_logprobs`, streamed and not, for base and
adapter requests, against HF transformers + PEFT log-softmax values (fp32, CPU)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Deployment
from .test_inference_api import client

MAX_TOKENS = 4
TOL = 1e-4


@pytest.mark.parametrize("adapter", [None, "a", "c"])
def test_completion_logprobs_equal_hf_peft(deployment: Deployment, reference: Any,
                                           adapter: str | None) -> None:
    prompt = [12, 40, 7, 99, 5]
    model = f"{deployment.namespace}/{adapter}" if adapter else str(
        deployment.agent.state()["served_model_name"])
    out = client(deployment).completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=3,
        extra_body={"ignore_eos": True})
    choice = out.choices[0]
    tokens = choice.model_extra["token_ids"]
    assert tokens == reference.greedy(prompt, MAX_TOKENS, adapter)
    lp = choice.logprobs
    assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == MAX_TOKENS
    want = reference.log_softmax(prompt, tokens, adapter)
    for i, token in enumerate(tokens):
        assert abs(lp.token_logprobs[i] - float(want[i, token])) < TOL
        # keyed by token text, as OpenAI's format is: ids whose text is the same share a
        # key, so a step may show fewer than 3; each shown value is one of the top 3
        ref_top = want[i].topk(3).values.tolist()
        shown = list(lp.top_logprobs[i].values())
        assert 1 <= len(shown) <= 3 and abs(max(shown) - ref_top[0]) < TOL
        assert all(min(abs(v - r) for r in ref_top) < TOL for v in shown)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(MAX_TOKENS)]
    assert "".join(lp.tokens) == choice.text

    streamed = list(client(deployment).completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=3,
        stream=True, extra_body={"ignore_eos": True}))
    per_chunk = [x for c in streamed if c.choices and c.choices[0].logprobs
                 for x in c.choices[0].logprobs.token_logprobs]
    assert per_chunk == lp.token_logprobs


def test_chat_logprobs_and_top_logprobs(deployment: Deployment) -> None:
    model = f"{deployment.namespace}/b"
    messages: Any = [{"role": "user", "content": "hi"}]
    out = client(deployment).chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
        top_logprobs=2, extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == MAX_TOKENS
    for entry in content:
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and entry.logprob <= values[0] + TOL
    plain = client(deployment).chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"ignore_eos": True})
    assert plain.choices[0].logprobs is None
    bad = client(deployment).with_options(max_retries=0)
    with pytest.raises(Exception) as err:
        bad.chat.completions.create(model=model, messages=messages, max_tokens=2,
                                    top_logprobs=2)
    assert getattr(err.value, "status_code", None) == 422
