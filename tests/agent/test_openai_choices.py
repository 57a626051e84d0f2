"""`n`, `best_of` and batched prompts through a real agent and the official openai client:
choice indices as OpenAI numbers them, greedy choices equal HF + PEFT, seeded samples equal
the same seeds asked for one at a time, the prompt is prefilled once for n samples, and
best_of returns the sample of highest mean token logprob."""

from __future__ import annotations

import random
from typing import Any

import httpx
import openai
import pytest

from .conftest import Deployment
from .test_inference_api import client


def _prompt_tokens(dep: Deployment, source: str) -> float:
    text = httpx.get(f"{dep.agent.url}/metrics", timeout=10).text
    line = f'prefix_cache_prompt_tokens_total{{source="{source}"}} '
    return sum(float(row[len(line):]) for row in text.splitlines() if row.startswith(line))


def _tokens(choice: Any) -> list[int]:
    return list(choice.model_extra["token_ids"])


def test_n_seeded_samples_share_one_prefill(deployment: Deployment) -> None:
    rng = random.Random(7)
    prompt = [rng.randrange(3, 256) for _ in range(40)]
    model = f"{deployment.namespace}/a"
    computed = _prompt_tokens(deployment, "computed")
    out = client(deployment).completions.create(
        model=model, prompt=prompt, max_tokens=5, temperature=1.0, seed=11, n=3,
        extra_body={"ignore_eos": True})
    computed = _prompt_tokens(deployment, "computed") - computed
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert computed < len(prompt) + 2 * (len(prompt) // 2)  # followers read the cache
    assert out.usage is not None and out.usage.prompt_tokens == len(prompt)
    assert out.usage.completion_tokens == 15
    samples = [_tokens(c) for c in out.choices]
    assert len({tuple(s) for s in samples}) > 1
    for k, sample in enumerate(samples):  # sample k is the request seeded seed + k
        alone = client(deployment).completions.create(
            model=model, prompt=prompt, max_tokens=5, temperature=1.0, seed=11 + k,
            extra_body={"ignore_eos": True})
        assert _tokens(alone.choices[0]) == sample


def test_batched_prompts_times_n_are_indexed_prompt_major(deployment: Deployment,
                                                          reference: Any) -> None:
    prompts = [[5, 6, 7], [40, 41], [99, 3, 12, 8]]
    out = client(deployment).completions.create(
        model=f"{deployment.namespace}/c", prompt=prompts, max_tokens=4, temperature=0, n=2,
        extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == list(range(6))
    for c in out.choices:
        assert _tokens(c) == reference.greedy(prompts[c.index // 2], 4, "c")
    assert out.usage is not None and out.usage.prompt_tokens == 9
    assert out.usage.completion_tokens == 24
    texts = client(deployment).completions.create(
        model=f"{deployment.namespace}/c", prompt=["hello there", "a b c"], max_tokens=3,
        temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in texts.choices] == [0, 1]
    for c, text in zip(texts.choices, ["hello there", "a b c"], strict=True):
        alone = client(deployment).completions.create(
            model=f"{deployment.namespace}/c", prompt=text, max_tokens=3, temperature=0,
            extra_body={"ignore_eos": True})
        assert (_tokens(c), c.text) == (_tokens(alone.choices[0]), alone.choices[0].text)


def test_best_of_returns_the_highest_mean_logprob_sample(deployment: Deployment) -> None:
    model, prompt = f"{deployment.namespace}/b", [17, 23, 99, 4]
    every = client(deployment).completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=1.0, seed=5, n=4, logprobs=0,
        extra_body={"ignore_eos": True})
    means = [sum(c.logprobs.token_logprobs) / 6 for c in every.choices]  # type: ignore[union-attr,arg-type]
    best = max(range(4), key=lambda k: (means[k], -k))
    out = client(deployment).completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=1.0, seed=5, best_of=4,
        extra_body={"ignore_eos": True})
    assert len(out.choices) == 1 and out.choices[0].index == 0
    assert _tokens(out.choices[0]) == _tokens(every.choices[best])
    assert out.choices[0].logprobs is None  # computed to rank, not asked for
    assert out.usage is not None and out.usage.completion_tokens == 24  # all 4 generated
    two = client(deployment).completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=1.0, seed=5, best_of=4, n=2,
        logprobs=1, extra_body={"ignore_eos": True})
    ranked = sorted(range(4), key=lambda k: (-means[k], k))[:2]
    assert [_tokens(c) for c in two.choices] == [_tokens(every.choices[k]) for k in ranked]
    assert all(c.logprobs is not None for c in two.choices)


def test_streamed_n_interleaves_choices_with_usage(deployment: Deployment) -> None:
    model, prompt = f"{deployment.namespace}/a", [8, 30, 2, 64, 9]
    full = client(deployment).completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0.8, seed=3, n=2,
        extra_body={"ignore_eos": True})
    chunks = list(client(deployment).completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0.8, seed=3, n=2, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    streamed: dict[int, list[int]] = {0: [], 1: []}
    finishes = {}
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index].extend(ch.model_extra["token_ids"])
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert streamed == {c.index: _tokens(c) for c in full.choices}
    assert finishes == {0: "length", 1: "length"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_chat_n(deployment: Deployment) -> None:
    out = client(deployment).chat.completions.create(
        model=f"{deployment.namespace}/b", messages=[{"role": "user", "content": "hi"}],
        max_tokens=3, temperature=1.0, seed=1, n=3, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.message.role == "assistant" for c in out.choices)


@pytest.mark.parametrize("body", [
    {"n": 3, "best_of": 2}, {"best_of": 2, "stream": True}, {"n": 33}, {"prompt": []},
    {"best_of": 0}, {"prompt": [[1, 2]] * 9, "best_of": 32},
])
def test_bad_choice_counts_are_422(deployment: Deployment, body: dict[str, Any]) -> None:
    payload = {"model": f"{deployment.namespace}/a", "prompt": [1, 2], "max_tokens": 2, **body}
    r = httpx.post(f"{deployment.agent.url}/v1/completions", json=payload, timeout=30,
                   headers={"Authorization": f"Bearer {deployment.reader_token}"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "VALIDATION_ERROR"
    with pytest.raises(openai.UnprocessableEntityError):
        client(deployment).completions.create(**payload)  # type: ignore[call-overload]
