"""One OpenAI request as engine requests: `best_of` samples (default `n`) of each prompt,
of which `n` are returned.

Choice `index` = prompt index x n + rank, as OpenAI numbers choices of batched prompts.
The samples of one prompt after the first wait for its prefill (Engine.add_request's
`prefill_after`) and read its full blocks from the prefix cache: the prompt is computed
once. A seeded request gives sample k the seed (seed + k) mod 2**63, so samples differ and
stay reproducible. With best_of > n a prompt's samples are ranked by mean token logprob
(OpenAI's "highest log probability per token"), ties by sample order; such samples
compute their chosen-token logprobs even when the response does not show them. Prompt
logprobs (echo) are computed by the first sample alone and shown for every choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dataplane.core import SamplingParams
from dataplane.engine.engine import RequestOutput

MAX_SAMPLES = 32
"""Largest `n` / `best_of`."""

MAX_CHILDREN = 256
"""Largest number of engine requests one API request may become (prompts x best_of)."""


@dataclass(frozen=True)
class Child:
    """One engine request of an API request."""

    request_id: str
    prompt_index: int
    sample: int
    prompt: str | list[int]
    params: SamplingParams
    prefill_after: str | None
    """The request whose prefill this one waits for (the prompt's first sample)."""


def children(request_id: str, prompts: Sequence[str | list[int]],
             params: Sequence[SamplingParams], samples: int, ranked: bool) -> list[Child]:
    """`samples` children per prompt; `ranked` (best_of > n): they report logprobs."""
    out: list[Child] = []
    for p, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
        first = f"{request_id}-{p}-0"
        for k in range(samples):
            child = sp
            if sp.seed is not None and k:
                child = dataclasses.replace(child, seed=(sp.seed + k) % 2**63)
            if ranked and sp.logprobs is None:
                child = dataclasses.replace(child, logprobs=0)
            if k and sp.prompt_logprobs is not None:  # the first sample scores the prompt
                child = dataclasses.replace(child, prompt_logprobs=None)
            out.append(Child(f"{request_id}-{p}-{k}", p, k, prompt, child,
                             None if k == 0 else first))
    return out


def mean_logprob(out: RequestOutput) -> float:
    """Mean chosen-token logprob of a finished sample (-inf when it generated none)."""
    lps = out.logprobs or ()
    return sum(lp.logprob for lp in lps) / len(lps) if lps else float("-inf")


def returned(kids: Sequence[Child], finals: Mapping[str, RequestOutput], n: int
             ) -> list[tuple[int, Child]]:
    """(choice index, child) of the returned samples, by index: per prompt the first `n`
    samples, or with more samples than `n` the `n` of highest mean logprob."""
    by_prompt: dict[int, list[Child]] = {}
    for kid in kids:
        by_prompt.setdefault(kid.prompt_index, []).append(kid)
    chosen: list[tuple[int, Child]] = []
    for p, group in sorted(by_prompt.items()):
        if len(group) > n:
            group = sorted(group, key=lambda c: (-mean_logprob(finals[c.request_id]),
                                                 c.sample))[:n]
        chosen.extend((p * n + rank, kid) for rank, kid in enumerate(group))
    return chosen
