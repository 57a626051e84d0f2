"""RequestOutput: what `Engine.step()` / `generate()` report for one request."""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.sampling.sampler import TokenLogprobs

__all__ = ["RequestOutput", "TokenLogprobs"]


@dataclass(slots=True)
class RequestOutput:
    """A request's state after a step. `new_*` is what this step added (for streaming).

    A snapshot the caller owns (built per row per step, so a plain slotted class: a frozen
    dataclass's field-by-field `object.__setattr__` costs about three times as much)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    new_token_ids: tuple[int, ...]
    text: str
    new_text: str
    finished: bool
    finish_reason: str | None
    logprobs: tuple[TokenLogprobs, ...] | None
    num_cached_tokens: int = 0
    """Prompt tokens whose K/V came from the prefix cache at the request's (last) admission."""
    num_cached_base_tokens: int = 0
    """Of those, the tokens an activated LoRA reused from base execution (blocks wholly
    before its invocation, which base requests and other aLoRAs of the base also key)."""
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    """With SamplingParams.prompt_logprobs: entry j scores prompt token j + 1 (the first
    prompt token has none), as far as the prompt has been computed; else None."""
