"""OpenAI-compatible request bodies (the subset the agent serves) -> SamplingParams.

Unknown fields are ignored (clients send many); fields whose meaning the agent cannot
honour (`n` > 1, `best_of`, `logit_bias`, `tools`) are refused with 422 rather than
silently ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dataplane.core import SamplingParams


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=300)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only n=1 is served.")
    ignore_eos: bool = False
    max_queue_ms: int | None = Field(
        default=None, ge=1, le=3_600_000,
        description="Extension: answer 503 (code QUEUE_TIMEOUT, with Retry-After) unless the "
                    "request starts within this many milliseconds of its arrival, adapter "
                    "load included (default: the agent's ADAPTERPLANE_AGENT_MAX_QUEUE_MS).")
    alora_base_if_not_invoked: bool = Field(
        default=False,
        description="Extension: on an activated-LoRA model whose invocation tokens the prompt "
                    "does not contain, answer with the base model instead of 422 "
                    "ALORA_NOT_INVOKED.")

    def sampling(self, max_tokens_default: int = 16) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              seed=self.seed, max_tokens=self.max_tokens or max_tokens_default,
                              stop=tuple(stop), ignore_eos=self.ignore_eos)


class CompletionRequest(_Common):
    prompt: str | list[int] = Field(description="Text, or token ids.")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def sampling(self, max_tokens_default: int = 16) -> SamplingParams:
        params = super().sampling(max_tokens_default)
        if self.max_completion_tokens is not None and self.max_tokens is None:
            params = SamplingParams(
                temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                seed=params.seed, max_tokens=self.max_completion_tokens, stop=params.stop,
                ignore_eos=params.ignore_eos)
        return params
