"""RequestOutput: what `Engine.step()` / `generate()` report for one request."""

from __future__ import annotations

from dataclasses import dataclass, field

from dataplane.sampling.sampler import TokenLogprobs

__all__ = ["RequestOutput", "TokenLogprobs"]


@dataclass(slots=True)
class RequestOutput:
    """A request's state after a step. `new_*` is what this step added (for streaming).

    A snapshot (built per row per step, so a plain slotted class: a frozen dataclass's
    field-by-field `object.__setattr__` costs about three times as much). `token_ids` is
    read from the request's token list as it was at this step (`_tokens[prompt:_end]`):
    the engine only appends to that list past `_end`, so the snapshot holds without
    copying every generated token into every step's output."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    _tokens: list[int] = field(repr=False)
    """The request's prompt + generated tokens (the engine's list, appended to later)."""
    _end: int = field(repr=False)
    """len(_tokens) at this step."""
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

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The tokens generated up to this step."""
        return tuple(self._tokens[len(self.prompt_token_ids):self._end])
