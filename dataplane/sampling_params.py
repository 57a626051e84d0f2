"""SamplingParams: how a request picks each next token and when it stops.

Torch-free; validated on construction, so a bad request is refused before it is queued.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from dataplane.errors import InvalidSamplingParams
from dataplane.errors import is_int as _is_int
from dataplane.response_format import ResponseFormat

MAX_LOGPROBS = 20
"""Largest number of top log-probabilities a request may ask for."""

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily (dividing logits by them overflows float32)."""

MAX_LOGIT_BIAS = 100.0
"""|bias| bound of one `logit_bias` entry (OpenAI's)."""

MAX_LOGIT_BIAS_ENTRIES = 1024
"""Largest number of token ids one request may bias."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop. Validated on construction.

    temperature 0 (or below GREEDY_TEMPERATURE) means greedy. top_k 0 and top_p 1.0 disable
    those filters. `seed` makes the request's draws reproducible independently of batch
    composition. `logprobs` is the number of top alternatives returned with each token
    (None: no logprobs; 0: only the chosen one). `prompt_logprobs` asks the same of every
    prompt token after the first (scored by the model after the tokens before it); such a
    request computes its whole prompt (no prefix-cache reads), and only it pays for the
    extra logits.

    Logit adjustments (sampling/logits_processors.py), applied before temperature, also to
    greedy rows: `logit_bias` adds a bias to a token id's logit (pairs sorted by id; a
    mapping is accepted); `min_tokens` keeps the stop tokens (eos unless `ignore_eos`, and
    `stop_token_ids`) from being sampled, and stop strings from matching, until that many
    tokens were generated; `repetition_penalty` (HF's: a logit of a token seen in the
    prompt or the output is divided by it when positive, multiplied when not),
    `frequency_penalty` (minus penalty x the token's count in the output) and
    `presence_penalty` (minus penalty once the token is in the output), OpenAI's and vLLM's
    semantics. `response_format` constrains the output to JSON (an object, or one valid
    against a schema: sampling/grammar.py); the request finishes when the JSON is complete,
    so it cannot be combined with `ignore_eos` or `min_tokens`.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False
    prompt_logprobs: int | None = None
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    response_format: ResponseFormat | None = None

    def __post_init__(self) -> None:
        # Accept any iterable for the tuple fields, store tuples (hashable, immutable).
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias
        object.__setattr__(self, "logit_bias",
                           tuple(bias.items() if isinstance(bias, Mapping) else bias))
        object.__setattr__(self, "stop", tuple([self.stop] if isinstance(self.stop, str)
                                               else self.stop))
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise InvalidSamplingParams("temperature must be a finite number >= 0", temperature=t)
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InvalidSamplingParams("top_k must be an int >= 0 (0 disables)", top_k=self.top_k)
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0:
            raise InvalidSamplingParams("top_p must be in (0, 1]", top_p=p)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise InvalidSamplingParams("seed must be an int in [0, 2**63)", seed=self.seed)
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidSamplingParams("max_tokens must be an int >= 1",
                                        max_tokens=self.max_tokens)
        if any(not _is_int(x) or x < 0 for x in self.stop_token_ids):
            raise InvalidSamplingParams("stop_token_ids must be ints >= 0",
                                        stop_token_ids=self.stop_token_ids)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidSamplingParams("stop strings must be non-empty str", stop=self.stop)
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise InvalidSamplingParams(f"logprobs must be an int in [0, {MAX_LOGPROBS}]",
                                        logprobs=self.logprobs)
        if self.prompt_logprobs is not None and (
            not _is_int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            raise InvalidSamplingParams(f"prompt_logprobs must be an int in [0, {MAX_LOGPROBS}]",
                                        prompt_logprobs=self.prompt_logprobs)
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParams("ignore_eos must be a bool", ignore_eos=self.ignore_eos)
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidSamplingParams("min_tokens must be an int in [0, max_tokens]",
                                        min_tokens=self.min_tokens, max_tokens=self.max_tokens)
        self._check_logit_bias()
        if self.response_format is not None:
            if not isinstance(self.response_format, ResponseFormat):
                raise InvalidSamplingParams("response_format must be a ResponseFormat")
            if self.ignore_eos or self.min_tokens:
                raise InvalidSamplingParams(
                    "response_format cannot be combined with ignore_eos or min_tokens (a "
                    "constrained output ends when its JSON is complete)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise InvalidSamplingParams(f"{name} must be a number in [-2, 2]",
                                            **{name: value})
        r = self.repetition_penalty
        if not _is_number(r) or not 0.0 < r <= 2.0:
            raise InvalidSamplingParams("repetition_penalty must be a number in (0, 2]",
                                        repetition_penalty=r)

    def _check_logit_bias(self) -> None:
        pairs = self.logit_bias
        if len(pairs) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidSamplingParams(
                f"logit_bias may name at most {MAX_LOGIT_BIAS_ENTRIES} token ids",
                entries=len(pairs))
        for pair in pairs:
            if (not isinstance(pair, tuple) or len(pair) != 2 or not _is_int(pair[0])
                    or pair[0] < 0 or not _is_number(pair[1])
                    or not -MAX_LOGIT_BIAS <= pair[1] <= MAX_LOGIT_BIAS):
                raise InvalidSamplingParams(
                    f"logit_bias maps token ids >= 0 to numbers in [-{MAX_LOGIT_BIAS:g}, "
                    f"{MAX_LOGIT_BIAS:g}]", entry=repr(pair))
        ids = [t for t, _ in pairs]
        if len(set(ids)) != len(ids):
            raise InvalidSamplingParams("logit_bias names a token id twice")
        object.__setattr__(self, "logit_bias", tuple(sorted(pairs)))

    @property
    def adjusts_logits(self) -> bool:
        """The request changes logits before sampling (logit bias, penalties, min_tokens
        while it has a token to hold back: a stop token id, or eos unless ignored)."""
        return bool(self.logit_bias or self.penalized or (
            self.min_tokens and (self.stop_token_ids or not self.ignore_eos)))

    @property
    def penalized(self) -> bool:
        """A repetition, frequency or presence penalty applies."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


def _is_number(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x)
