"""Structured output through a real agent and the official openai client: `response_format`
json_schema (chat and completions, streamed, n > 1) always parses and validates (json_object
on a real model: tests/engine/test_structured_output.py);
a bad format is 422 INVALID_RESPONSE_FORMAT naming `response_format` and nothing runs."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from .conftest import Deployment
from .test_inference_api import client

ITEM = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 1, "maximum": 999},
    "label": {"type": "string", "maxLength": 6},
    "kind": {"enum": ["x", "y"]}}, "required": ["id", "label", "kind"],
    "additionalProperties": False}


def _schema_format(strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM,
                                                   "strict": strict}}


@pytest.mark.parametrize("alias", ["a", "b"])
def test_chat_json_schema_validates(deployment: Deployment, alias: str) -> None:
    for seed in (1, 2, 3):
        out = client(deployment).chat.completions.create(
            model=f"{deployment.namespace}/{alias}", temperature=1.0, seed=seed,
            messages=[{"role": "user", "content": "an item please"}], max_tokens=80,
            response_format=_schema_format())  # type: ignore[arg-type]
        choice = out.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content or ""), ITEM)


def test_completions_json_schema_streamed_and_n(deployment: Deployment) -> None:
    """(A free-form json_object from the tiny random model need not close within the
    token budget; the schema's bounds make every answer end.)"""
    model = f"{deployment.namespace}/c"
    full = client(deployment).completions.create(
        model=model, prompt="{", max_tokens=80, temperature=0.9, seed=4, n=2,
        extra_body={"response_format": _schema_format(strict=False)})
    for c in full.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), ITEM)
    chunks = list(client(deployment).completions.create(
        model=model, prompt="{", max_tokens=80, temperature=0.9, seed=4, n=2, stream=True,
        extra_body={"response_format": _schema_format(strict=False)}))
    streamed = {0: "", 1: ""}
    for ch in chunks:
        for c in ch.choices:
            streamed[c.index] += c.text
    assert streamed == {c.index: c.text for c in full.choices}


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema"}, {"type": "xml"},
    {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"v": {"type": "string", "minLength": 4,
                                               "maxLength": 1}}, "required": ["v"]},
        "strict": True}},
])
def test_a_bad_format_is_refused(deployment: Deployment, fmt: dict[str, Any]) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client(deployment).chat.completions.create(
            model=f"{deployment.namespace}/a", max_tokens=8,
            messages=[{"role": "user", "content": "x"}], response_format=fmt)  # type: ignore[arg-type]
    assert (err.value.code, err.value.param) == ("INVALID_RESPONSE_FORMAT", "response_format")


def test_response_format_with_ignore_eos_is_refused(deployment: Deployment) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client(deployment).completions.create(
            model=f"{deployment.namespace}/a", prompt="x", max_tokens=8,
            extra_body={"response_format": {"type": "json_object"}, "ignore_eos": True})
    assert "ignore_eos" in err.value.message
