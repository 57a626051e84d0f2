"""Fixed-seed workloads for bench/serving.py: prompts, lengths, models and arrival times.

Everything is generated locally from `seed` (Python's `random.Random`, one stream per
aspect, so changing the arrival process does not change the prompts or which model each
request names): no dataset or tokenizer is downloaded.

Datasets (prompts are token-id lists, sent as `"prompt": [ids]`):
  random         every request `input_len` prompt tokens and `output_len` output tokens;
                 ids uniform in [`min_token_id`, `vocab_size`) (the low ids of most
                 tokenizers are special tokens, kept out by default).
  sharegpt-like  the same random ids, lengths drawn per request from lognormal
                 distributions: prompt length = round(exp(N(ln SHAREGPT.input_median,
                 SHAREGPT.input_sigma))), output likewise, each clipped to
                 [SHAREGPT.min_len, SHAREGPT.max_len]. A heavy right tail of long prompts
                 and answers, like chat logs; the parameters are stated, not fitted.

Models: request i names `models[k]`, k drawn uniformly or from Zipf(s) popularity
(P(k) proportional to 1 / (k + 1)^s, so `models[0]` is the most popular).

Arrivals: offsets from the start in seconds. `rate = inf`: every request at 0 (only
`max_concurrency` limits how many are in flight); else `poisson` (exponential gaps of mean
1 / rate) or `constant` (gaps of exactly 1 / rate).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LognormalLengths:
    """Parameters of the `sharegpt-like` length distributions (tokens)."""

    input_median: float = 200.0
    input_sigma: float = 1.0
    output_median: float = 150.0
    output_sigma: float = 0.8
    min_len: int = 4
    max_len: int = 1024


SHAREGPT = LognormalLengths()


@dataclass(frozen=True)
class WorkloadSpec:
    dataset: str = "random"
    num_requests: int = 32
    input_len: int = 128
    output_len: int = 64
    vocab_size: int = 49152
    min_token_id: int = 100
    models: tuple[str, ...] = ()
    popularity: str = "uniform"
    request_rate: float = math.inf
    arrival: str = "poisson"
    seed: int = 0


@dataclass(frozen=True)
class WorkloadRequest:
    index: int
    prompt: list[int]
    output_len: int
    model: str
    model_index: int
    arrival_s: float


class WorkloadError(ValueError):
    """A workload option that cannot be generated (bad popularity, empty model list...)."""


def _lengths(spec: WorkloadSpec, rng: random.Random) -> list[tuple[int, int]]:
    if spec.dataset == "random":
        return [(spec.input_len, spec.output_len)] * spec.num_requests
    if spec.dataset != "sharegpt-like":
        raise WorkloadError(f"unknown dataset {spec.dataset!r} (random | sharegpt-like)")
    p = SHAREGPT

    def draw(median: float, sigma: float) -> int:
        return min(p.max_len, max(p.min_len, round(rng.lognormvariate(math.log(median),
                                                                      sigma))))

    return [(draw(p.input_median, p.input_sigma), draw(p.output_median, p.output_sigma))
            for _ in range(spec.num_requests)]


def popularity_weights(popularity: str, n: int) -> list[float]:
    """`uniform` or `zipf:S` (S > 0) over n models, normalised."""
    if popularity == "uniform":
        raw = [1.0] * n
    elif popularity.startswith("zipf:"):
        try:
            s = float(popularity.removeprefix("zipf:"))
        except ValueError as exc:
            raise WorkloadError(f"bad popularity {popularity!r} (zipf:S)") from exc
        if not s > 0:
            raise WorkloadError(f"zipf exponent must be > 0, not {s}")
        raw = [1.0 / (k + 1) ** s for k in range(n)]
    else:
        raise WorkloadError(f"unknown popularity {popularity!r} (uniform | zipf:S)")
    total = sum(raw)
    return [w / total for w in raw]


def arrival_offsets(n: int, rate: float, arrival: str, rng: random.Random) -> list[float]:
    if math.isinf(rate):
        return [0.0] * n
    if not rate > 0:
        raise WorkloadError(f"request rate must be > 0 or inf, not {rate}")
    if arrival not in ("poisson", "constant"):
        raise WorkloadError(f"unknown arrival {arrival!r} (poisson | constant)")
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate) if arrival == "poisson" else 1.0 / rate
    return out


def make_workload(spec: WorkloadSpec) -> list[WorkloadRequest]:
    """The requests of `spec`, in arrival order (index = position)."""
    if not spec.models:
        raise WorkloadError("no model to send requests to")
    if spec.num_requests < 1:
        raise WorkloadError("num_requests must be >= 1")
    if not 0 <= spec.min_token_id < spec.vocab_size:
        raise WorkloadError("need 0 <= min_token_id < vocab_size")
    lengths = _lengths(spec, random.Random(f"{spec.seed}:lengths"))
    ids = random.Random(f"{spec.seed}:prompts")
    pick = random.Random(f"{spec.seed}:models")
    weights = popularity_weights(spec.popularity, len(spec.models))
    chosen = pick.choices(range(len(spec.models)), weights=weights, k=spec.num_requests)
    times = arrival_offsets(spec.num_requests, spec.request_rate, spec.arrival,
                            random.Random(f"{spec.seed}:arrivals"))
    out = []
    for i, ((plen, olen), k, t) in enumerate(zip(lengths, chosen, times, strict=True)):
        prompt = [ids.randrange(spec.min_token_id, spec.vocab_size) for _ in range(plen)]
        out.append(WorkloadRequest(i, prompt, olen, spec.models[k], k, t))
    return out
