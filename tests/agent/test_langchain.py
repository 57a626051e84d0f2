"""langchain-openai against a real agent: `ChatOpenAI` (invoke and stream) and the
completions `OpenAI` LLM (invoke and a batched generate) on an adapter alias return the
text the official openai client gets for the same request, and name the model served."""

from __future__ import annotations

from functools import reduce
from operator import add
from typing import Any

from pydantic import SecretStr

from .conftest import Deployment
from .test_inference_api import client

MAX_TOKENS = 6
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": MAX_TOKENS, "max_retries": 0,
                          "timeout": 60.0, "extra_body": {"ignore_eos": True}}
"""`ignore_eos`: exactly MAX_TOKENS tokens each time, so the usage counts are known."""


def _connection(dep: Deployment) -> dict[str, Any]:
    return {"base_url": f"{dep.agent.url}/v1", "api_key": SecretStr(dep.reader_token)}


def test_chat_openai_invoke_and_stream_equal_the_openai_client(deployment: Deployment) -> None:
    from langchain_openai import ChatOpenAI

    model = f"{deployment.namespace}/b"
    chat = ChatOpenAI(model=model, stream_usage=True, **_connection(deployment), **GREEDY)
    question = "What is the capital of France?"
    answer = chat.invoke(question)
    want = client(deployment).chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}],
        max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    assert answer.content == want.choices[0].message.content
    assert answer.response_metadata["model_name"] == model
    assert answer.response_metadata["finish_reason"] == "length"
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == MAX_TOKENS

    chunks = list(chat.stream(question))
    assert len(chunks) > 1
    assert "".join(str(c.content) for c in chunks) == answer.content
    merged = reduce(add, chunks)
    assert merged.response_metadata["model_name"] == model
    assert merged.response_metadata["finish_reason"] == "length"
    assert merged.usage_metadata is not None  # from stream_options.include_usage
    got, want_usage = merged.usage_metadata, answer.usage_metadata  # cache hits may differ
    assert (got["input_tokens"], got["output_tokens"], got["total_tokens"]) == (
        want_usage["input_tokens"], want_usage["output_tokens"], want_usage["total_tokens"])


def test_openai_completions_llm_equals_the_openai_client(deployment: Deployment) -> None:
    from langchain_openai import OpenAI

    model = f"{deployment.namespace}/c"
    llm = OpenAI(model=model, **_connection(deployment), **GREEDY)
    prompts = ["Once upon a time", "The quick brown fox"]

    def official(prompt: str) -> str:
        out = client(deployment).completions.create(
            model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True})
        return out.choices[0].text

    assert llm.invoke(prompts[0]) == official(prompts[0])
    batched = llm.generate(prompts)  # one request whose `prompt` is the list
    assert [g[0].text for g in batched.generations] == [official(p) for p in prompts]
    assert batched.llm_output is not None and batched.llm_output["model_name"] == model
    assert batched.llm_output["token_usage"]["completion_tokens"] == MAX_TOKENS * len(prompts)
    assert "".join(llm.stream(prompts[1])) == official(prompts[1])
