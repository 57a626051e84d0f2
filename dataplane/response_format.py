"""OpenAI `response_format` as a value: what a request's output must be, and the cache key
of its compiled grammar.

Torch-free (stdlib only), so `SamplingParams` and request parsing can carry it without
loading the grammar library; `dataplane.sampling.grammar` compiles it.

Accepted shapes (OpenAI's chat completions API):

* `{"type": "text"}` — no constraint (`from_openai` returns None);
* `{"type": "json_object"}` — any JSON object;
* `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...,
  "description": ...}}` — a JSON object valid against `schema` (`name` required, OpenAI's
  pattern; `schema` required; `strict` and `description` optional).

The schema is stored as compact JSON text in its own key order (the order of `properties`
is the order the output is generated in, so it is part of the constraint): two requests
whose schemas differ only in whitespace or string escapes share one compiled grammar.
`name` and `description` do not change the constraint and are not kept; `strict` is kept
because it decides whether a schema keyword the grammar cannot enforce is refused (strict)
or ignored (best effort).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dataplane.errors import InvalidSamplingParams

ResponseFormatKind = Literal["json_object", "json_schema"]

MAX_SCHEMA_CHARS = 131_072
"""Longest schema accepted (compact JSON characters): bounds the compile work one request
can ask for."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOP_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


class InvalidResponseFormat(InvalidSamplingParams):
    """A `response_format` the engine refuses: a malformed shape, a schema that is not valid
    JSON Schema, or (strict) a schema keyword the grammar cannot enforce."""

    code = "INVALID_RESPONSE_FORMAT"


def canonical_schema(schema: object) -> str:
    """Compact JSON text of a JSON Schema object (a dict), key order kept; typed error for
    anything else (a non-dict, NaN or infinity, a non-JSON value)."""
    if not isinstance(schema, Mapping):
        raise InvalidResponseFormat("json_schema.schema must be a JSON object",
                                    got=type(schema).__name__)
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidResponseFormat(f"json_schema.schema is not JSON: {exc}") from exc
    if len(text) > MAX_SCHEMA_CHARS:
        raise InvalidResponseFormat("json_schema.schema is too large", chars=len(text),
                                    max_chars=MAX_SCHEMA_CHARS)
    return text


@dataclass(frozen=True)
class ResponseFormat:
    """A structured-output constraint; frozen and hashable (the grammar cache key).

    `schema` is the schema's compact JSON text for "json_schema" (re-serialised on
    construction, so whitespace and escapes do not matter; key order does) and None for
    "json_object". `strict` is False for "json_object".
    """

    kind: ResponseFormatKind
    schema: str | None = None
    strict: bool = False

    def __post_init__(self) -> None:
        if self.kind == "json_object":
            if self.schema is not None or self.strict:
                raise InvalidResponseFormat("json_object takes no schema and no strict flag")
            return
        if self.kind != "json_schema":
            raise InvalidResponseFormat("kind must be 'json_object' or 'json_schema'",
                                        kind=self.kind)
        if not isinstance(self.strict, bool):
            raise InvalidResponseFormat("strict must be a boolean")
        if not isinstance(self.schema, str):
            raise InvalidResponseFormat("a json_schema format needs its schema as JSON text")
        try:
            parsed = json.loads(self.schema)
        except (ValueError, RecursionError) as exc:
            raise InvalidResponseFormat(f"schema is not valid JSON: {exc}") from exc
        object.__setattr__(self, "schema", canonical_schema(parsed))

    @classmethod
    def json_object(cls) -> ResponseFormat:
        return cls("json_object")

    @classmethod
    def from_schema(cls, schema: Mapping[str, Any], *, strict: bool = False) -> ResponseFormat:
        return cls("json_schema", canonical_schema(schema), strict)

    @classmethod
    def from_openai(cls, value: object) -> ResponseFormat | None:
        """Parse OpenAI's `response_format` (a dict); None for `{"type": "text"}`.

        Refuses with InvalidResponseFormat: a non-dict, an unknown type, unknown keys, a
        missing or malformed `name`, a missing `schema` or one that is not a JSON object, a
        non-boolean `strict`, a non-string `description`."""
        if not isinstance(value, Mapping):
            raise InvalidResponseFormat("response_format must be an object")
        kind = value.get("type")
        if not isinstance(kind, str) or kind not in _TOP_KEYS:
            raise InvalidResponseFormat(
                "response_format.type must be 'text', 'json_object' or 'json_schema'", got=kind)
        _refuse_unknown(value, _TOP_KEYS[kind], "response_format")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object()
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise InvalidResponseFormat("response_format.json_schema must be an object")
        _refuse_unknown(spec, _SCHEMA_KEYS, "response_format.json_schema")
        name = spec.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidResponseFormat(
                "json_schema.name must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'")
        if "description" in spec and not isinstance(spec["description"], str):
            raise InvalidResponseFormat("json_schema.description must be a string")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidResponseFormat("json_schema.strict must be a boolean or null")
        if "schema" not in spec:
            raise InvalidResponseFormat("json_schema.schema is required")
        return cls.from_schema(spec["schema"], strict=bool(strict))


def _refuse_unknown(value: Mapping[Any, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise InvalidResponseFormat(f"{where} has unknown fields: {', '.join(unknown)}",
                                    unknown=unknown)
