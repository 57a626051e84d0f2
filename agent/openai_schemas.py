"""OpenAI-compatible request bodies (the subset the agent serves) -> SamplingParams.

Fields the agent does not know are ignored (clients send many: `user`, `metadata`, ...),
except OpenAI's (and vLLM's) generation fields whose meaning it does not honour yet:
those are refused with 422 UNSUPPORTED_PARAMETER naming the field, unless they carry their
neutral value (`UNSUPPORTED`), so no request is ever answered as if they had been applied.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.openai_choices import MAX_CHILDREN, MAX_SAMPLES
from dataplane.core import ResponseFormat, SamplingParams
from dataplane.sampling_params import MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_ENTRIES, MAX_LOGPROBS

UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "echo": (None, False), "suffix": (None, ""), "min_p": (None, 0),
    "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "guided_json": (None,),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    "prompt_logprobs": (None,), "use_beam_search": (None, False),
}
"""Generation fields not served yet -> the values that leave a request unchanged."""


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=300)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES,
                   description="Choices per prompt; the prompt is prefilled once.")
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(
        default_factory=list, max_length=1024,
        description="Extension (as vLLM's): finish (reason `stop`) when one of these token "
                    "ids is generated, even with `ignore_eos`; the id ends the output's "
                    "token ids, its text is not added.")
    max_queue_ms: int | None = Field(
        default=None, ge=1, le=3_600_000,
        description="Extension: answer 503 (code QUEUE_TIMEOUT, with Retry-After) unless the "
                    "request starts within this many milliseconds of its arrival, adapter "
                    "load included (default: the agent's ADAPTERPLANE_AGENT_MAX_QUEUE_MS).")
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: float = Field(
        default=1.0, gt=0, le=2,
        description="Extension (as vLLM's): a logit of a token already in the prompt or "
                    "the output is divided by this when positive, multiplied when not.")
    logit_bias: dict[str, float] | None = Field(
        default=None, max_length=MAX_LOGIT_BIAS_ENTRIES,
        description="Token id (as a string) -> bias in [-100, 100] added to its logit.")
    min_tokens: int = Field(
        default=0, ge=0,
        description="Extension (as vLLM's): no stop token or string ends the output before "
                    "this many tokens.")
    response_format: dict[str, Any] | None = Field(
        default=None,
        description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                    '"json_schema": {"name", "schema", "strict"}}: the output is JSON (valid '
                    "against the schema), enforced token by token.")
    alora_base_if_not_invoked: bool = Field(
        default=False,
        description="Extension: on an activated-LoRA model whose invocation tokens the prompt "
                    "does not contain, answer with the base model instead of 422 "
                    "ALORA_NOT_INVOKED.")

    @field_validator("logit_bias")
    @classmethod
    def _bias_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys are token ids, got {key!r}")
            if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias values are in [-100, 100], got {value}")
        return bias

    def unsupported(self) -> str | None:
        """The first field of the body (`UNSUPPORTED`) set to a value the agent would not
        honour, or None."""
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            if name in extra and not any(_same(extra[name], v) for v in neutral):
                return name
        return None

    def sampling(self, max_tokens_default: int = 16) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              seed=self.seed, max_tokens=self.max_tokens or max_tokens_default,
                              stop=tuple(stop), ignore_eos=self.ignore_eos,
                              stop_token_ids=tuple(self.stop_token_ids),
                              logprobs=self.top_logprobs_wanted(),
                              min_tokens=self.min_tokens,
                              logit_bias=tuple((int(k), v)
                                               for k, v in (self.logit_bias or {}).items()),
                              presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty,
                              response_format=None if self.response_format is None
                              else ResponseFormat.from_openai(self.response_format))

    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per generated token to report (None: no logprobs at all)."""
        return None

    @property
    def samples(self) -> int:
        """Samples generated per prompt (`best_of`, else `n`)."""
        return self.n


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="Text or token ids; or a list of either (one choice per prompt x n).")
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS,
                                 description="Log-probabilities of each generated token and "
                                             "of this many most likely alternatives.")
    best_of: int | None = Field(
        default=None, ge=1, le=MAX_SAMPLES,
        description="Samples generated per prompt, of which the n of highest mean token "
                    "logprob are returned (>= n; not with stream).")
    echo: bool = Field(default=False,
                       description="Return the prompt before the completion (and, with "
                                   "logprobs, the prompt tokens' logprobs).")
    max_tokens: int | None = Field(default=None, ge=0,
                                   description="0 only with echo: score the prompt alone.")

    @model_validator(mode="after")
    def _choices(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be >= n ({self.n})")
        if self.stream and self.samples > self.n:
            raise ValueError("best_of > n cannot be streamed")
        if len(self.prompts()) * self.samples > MAX_CHILDREN:
            raise ValueError(f"prompts x best_of must be <= {MAX_CHILDREN}")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts, in order: a string, a token-id list, or a list of either."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)  # type: ignore[arg-type]

    @property
    def samples(self) -> int:
        return self.best_of or self.n

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs

    def sampling(self, max_tokens_default: int = 16) -> SamplingParams:
        """max_tokens 0 (echo) generates one token that the response leaves out."""
        params = super().sampling(max_tokens_default)
        if self.max_tokens == 0:
            params = dataclasses.replace(params, max_tokens=1, min_tokens=0)
        if self.echo and self.logprobs is not None:
            params = dataclasses.replace(params, prompt_logprobs=self.logprobs)
        return params


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def top_logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def sampling(self, max_tokens_default: int = 16) -> SamplingParams:
        params = super().sampling(max_tokens_default)
        if self.max_completion_tokens is not None and self.max_tokens is None:
            params = dataclasses.replace(params, max_tokens=self.max_completion_tokens)
        return params


def _same(value: object, neutral: object) -> bool:
    """`value` is `neutral`: numbers by value, bools only as bools (`"echo": 0` is not
    `false`), everything else by type and value."""
    if isinstance(neutral, bool) or isinstance(value, bool):
        return value is neutral
    if isinstance(neutral, int | float) and isinstance(value, int | float):
        return value == neutral
    return type(value) is type(neutral) and value == neutral
