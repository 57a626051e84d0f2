"""SamplingParams: how a request picks each next token and when it stops.

Torch-free; validated on construction, so a bad request is refused before it is queued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dataplane.errors import InvalidSamplingParams
from dataplane.errors import is_int as _is_int

MAX_LOGPROBS = 20
"""Largest number of top log-probabilities a request may ask for."""

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily (dividing logits by them overflows float32)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop. Validated on construction.

    temperature 0 (or below GREEDY_TEMPERATURE) means greedy. top_k 0 and top_p 1.0 disable
    those filters. `seed` makes the request's draws reproducible independently of batch
    composition. `logprobs` is the number of top alternatives returned with each token
    (None: no logprobs; 0: only the chosen one).
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

    def __post_init__(self) -> None:
        # Accept any iterable for the two tuple fields, store tuples (hashable, immutable).
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
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
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParams("ignore_eos must be a bool", ignore_eos=self.ignore_eos)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE
