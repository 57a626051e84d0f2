"""End to end: control plane (API + Celery worker + S3) and a real agent process on CPU.

Completions through the official `openai` client must equal HF transformers + PEFT
greedy outputs for each alias, report the generation and artifact digest they ran on,
and fail with the documented status — never by falling back to another model.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from .conftest import Deployment

MAX_TOKENS = 6


def client(dep: Deployment, token: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{dep.agent.url}/v1", api_key=token or dep.reader_token,
                         max_retries=0, timeout=60.0)


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(3, 12))] for _ in range(n)]


def complete(dep: Deployment, model: str, prompt: list[int],
             max_tokens: int = MAX_TOKENS) -> Any:
    return client(dep).completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                          temperature=0, extra_body={"ignore_eos": True})


def test_placement_prefetches_the_published_working_set(deployment: Deployment) -> None:
    wanted = {deployment.artifacts[n]["digest"] for n in ("a", "b", "c")}

    def prefetched(state: dict[str, Any]) -> bool:
        held = {s["artifact_digest"] for s in state["slots"]
                if s["prefetch"] and s["state"] in ("active", "idle")}
        return held >= wanted

    deployment.agent.wait_for(prefetched)


def test_concurrent_completions_equal_hf_peft_reference(deployment: Deployment,
                                                        reference: Any) -> None:
    ns = deployment.namespace
    jobs = [(name, p) for i, name in enumerate(["a", "b", "c", None] * 3)
            for p in prompts(1, seed=i)]
    base_name = deployment.agent.state()["served_model_name"]

    def run(job: tuple[str | None, list[int]]) -> Any:
        name, prompt = job
        return complete(deployment, f"{ns}/{name}" if name else base_name, prompt)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, jobs))
    for (name, prompt), res in zip(jobs, results, strict=True):
        expected = reference.greedy(prompt, MAX_TOKENS, name)
        choice = res.choices[0]
        assert choice.model_extra["token_ids"] == expected, (name, prompt)
        assert res.usage.prompt_tokens == len(prompt)
        assert res.usage.completion_tokens == MAX_TOKENS
        binding = res.model_extra["adapterplane"]
        if name is None:
            assert binding is None
        else:
            art = deployment.artifacts[name]
            assert binding == {"namespace": ns, "alias": name, "generation": 1,
                               "artifact_digest": art["digest"]}


def test_streaming_and_chat_agree_with_non_streaming(deployment: Deployment,
                                                     reference: Any) -> None:
    ns = deployment.namespace
    prompt = prompts(1, seed=99)[0]
    expected = reference.greedy(prompt, MAX_TOKENS, "b")
    chunks = list(client(deployment).completions.create(
        model=f"{ns}/b", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    streamed = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
    assert streamed == expected
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert {c.model_extra["adapterplane"]["generation"] for c in chunks} == {1}

    messages = [{"role": "user", "content": "hello there"}]
    chat = client(deployment).chat.completions.create(
        model=f"{ns}/c", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"ignore_eos": True})
    chat_prompt = list(b"user: hello there\nassistant:")
    assert chat.choices[0].model_extra["token_ids"] == reference.greedy(chat_prompt,
                                                                        MAX_TOKENS, "c")
    assert chat.usage.prompt_tokens == len(chat_prompt)
    stream = client(deployment).chat.completions.create(
        model=f"{ns}/c", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
        stream=True, extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == chat.choices[0].message.content


def test_models_lists_readable_aliases(deployment: Deployment) -> None:
    ids = {m.id for m in client(deployment).models.list().data}
    ns = deployment.namespace
    assert {f"{ns}/a", f"{ns}/b", f"{ns}/c"} <= ids
    outsider = {m.id for m in client(deployment, deployment.outsider_token).models.list().data}
    assert not any(i.startswith(f"{ns}/") for i in outsider)


@pytest.mark.parametrize("case", ["unknown", "unknown_generation", "rank", "scope",
                                  "no_token", "bad_model"])
def test_errors_have_documented_status(deployment: Deployment, case: str) -> None:
    ns = deployment.namespace
    model, token, status, code = {
        "unknown": (f"{ns}/nope", deployment.reader_token, 404, "NOT_FOUND"),
        "unknown_generation": (f"{ns}/a@99", deployment.reader_token, 404, "NOT_FOUND"),
        "rank": (f"{ns}/wide", deployment.reader_token, 422, "UNSUPPORTED_ADAPTER"),
        "scope": (f"{ns}/a", deployment.outsider_token, 403, "FORBIDDEN"),
        "no_token": (f"{ns}/a", "", 401, "UNAUTHENTICATED"),
        "bad_model": ("no slash here", deployment.reader_token, 422, "VALIDATION_ERROR"),
    }[case]
    if case == "rank":
        deployment.admin.publish(ns, "wide", deployment.artifacts["wide"]["id"])
        deployment.agent.wait_for(lambda s: _knows(deployment, "wide"))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.post(f"{deployment.agent.url}/v1/completions", headers=headers,
                          json={"model": model, "prompt": [5, 6, 7], "max_tokens": 2},
                          timeout=30)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def _knows(dep: Deployment, alias: str) -> bool:
    models = httpx.get(f"{dep.agent.url}/v1/models", timeout=10,
                       headers={"Authorization": f"Bearer {dep.reader_token}"}).json()
    return any(m["id"] == f"{dep.namespace}/{alias}" for m in models["data"])


def test_retired_alias_is_410_and_never_falls_back(deployment: Deployment) -> None:
    ns = deployment.namespace
    deployment.admin.publish(ns, "temp", deployment.artifacts["a"]["id"])
    deployment.agent.wait_for(lambda s: _knows(deployment, "temp"))
    assert complete(deployment, f"{ns}/temp", [9, 9, 9]).choices[0].model_extra["token_ids"]
    deployment.admin.retire(ns, "temp")
    deployment.agent.wait_for(lambda s: not _knows(deployment, "temp"))
    with pytest.raises(openai.APIStatusError) as err:
        complete(deployment, f"{ns}/temp", [9, 9, 9])
    assert err.value.status_code == 410
    assert err.value.response.json()["error"]["code"] == "ALIAS_RETIRED"


def test_corrupted_object_is_never_published_or_served(deployment: Deployment) -> None:
    """Bytes in object storage that no longer match the validated digest: publishing the
    artifact is refused (409 ARTIFACT_CORRUPT, nothing published), so the agent never
    serves the alias, with this adapter or any other. (A blob corrupted after publication
    fails the agent's own digest check at download: tests/agent/test_catalog_and_artifacts.py.)"""
    ns, art = deployment.namespace, deployment.artifacts["corrupt"]
    weights = art["files"]["adapter_model.safetensors"]
    deployment.s3.put_object(Bucket=deployment.bucket, Key=f"objects/{weights['key']}",
                             Body=b"\x00" * weights["size"])
    refused = deployment.admin.http.post(f"/v1/namespaces/{ns}/aliases/corrupt/publish",
                                         json={"artifact": str(art["id"])})
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "ARTIFACT_CORRUPT"
    assert refused.json()["detail"]["fault"] == "digest"
    with pytest.raises(openai.NotFoundError):
        complete(deployment, f"{ns}/corrupt", [4, 5, 6])
    state = deployment.agent.state()
    assert all(s["artifact_digest"] != art["digest"] for s in state["slots"])


@pytest.mark.parametrize(("field", "value"), [
    ("suffix", "tail"),
    ("tools", [{"type": "function"}]), ("use_beam_search", True),
])
def test_an_unhonoured_field_is_refused_naming_it(deployment: Deployment, field: str,
                                                   value: object) -> None:
    """Never silently ignored: 422 UNSUPPORTED_PARAMETER as an OpenAI error object, so the
    official client raises with `code`, `param` and `type` set."""
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client(deployment).completions.create(
            model=f"{deployment.namespace}/a", prompt=[5, 6, 7], max_tokens=2,
            extra_body={field: value})
    assert (err.value.code, err.value.param, err.value.type) == (
        "UNSUPPORTED_PARAMETER", field, "invalid_request_error")


def test_neutral_values_of_those_fields_are_served(deployment: Deployment,
                                                   reference: Any) -> None:
    prompt = [5, 6, 7]
    out = client(deployment).completions.create(
        model=f"{deployment.namespace}/a", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"ignore_eos": True, "echo": False, "best_of": 1, "logit_bias": {},
                    "presence_penalty": 0, "frequency_penalty": 0.0, "stop_token_ids": [],
                    "response_format": {"type": "text"}, "user": "someone"})
    assert out.choices[0].model_extra["token_ids"] == reference.greedy(prompt, MAX_TOKENS, "a")


def test_errors_are_openai_error_objects(deployment: Deployment) -> None:
    ns = deployment.namespace
    cases = [({"model": f"{ns}/nope", "prompt": [1]}, deployment.reader_token, 404,
              "NOT_FOUND", "invalid_request_error", None),
             ({"model": f"{ns}/a", "prompt": [1]}, deployment.outsider_token, 403,
              "FORBIDDEN", "permission_error", None),
             ({"model": f"{ns}/a", "prompt": [1]}, "wrong", 401, "UNAUTHENTICATED",
              "authentication_error", None),
             ({"model": f"{ns}/a", "prompt": [1], "max_tokens": 0}, deployment.reader_token,
              422, "VALIDATION_ERROR", "invalid_request_error", "max_tokens")]
    for body, token, status, code, kind, param in cases:
        r = httpx.post(f"{deployment.agent.url}/v1/completions", json=body, timeout=30,
                       headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert (error["code"], error["type"], error["param"]) == (code, kind, param), error
        assert isinstance(error["message"], str) and error["message"]


def test_stop_token_ids_end_the_answer_with_reason_stop(deployment: Deployment,
                                                        reference: Any) -> None:
    prompt = [8, 30, 2, 64]
    greedy = reference.greedy(prompt, MAX_TOKENS, "a")
    stop_at = next(i for i in range(1, MAX_TOKENS) if greedy[i] not in greedy[:i])
    out = client(deployment).completions.create(
        model=f"{deployment.namespace}/a", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"ignore_eos": True, "stop_token_ids": [greedy[stop_at]]})
    choice = out.choices[0]
    assert choice.model_extra["token_ids"] == greedy[:stop_at + 1]
    assert choice.finish_reason == "stop"
