"""bench/synthetic.py's trace: adapter popularity (Zipf(1.0) or uniform), and the same
arrivals, prompts and lengths whichever popularity draws the adapters."""

from __future__ import annotations

import argparse
from collections import Counter

from bench.synthetic import make_trace


def _args(popularity: str | None) -> argparse.Namespace:
    values: dict[str, object] = dict(seed=3, requests=6000, rate=2.0, prompt_min=4, prompt_max=9,
                  output_min=2, output_max=5)
    if popularity is not None:
        values["popularity"] = popularity
    return argparse.Namespace(**values)


def test_popularity_draws_adapters_by_their_weights() -> None:
    n = 4
    zipf = Counter(r.adapter for r in make_trace(_args("zipf"), 100, n))
    uniform = Counter(r.adapter for r in make_trace(_args("uniform"), 100, n))
    total_weight = sum(1 / (i + 1) for i in range(n))
    for i in range(n):  # within 10% of the expected share (6,000 draws)
        expected = 6000 * (1 / (i + 1)) / total_weight
        assert abs(zipf[i] - expected) < 0.1 * expected
        assert abs(uniform[i] - 1500) < 150
    assert Counter(r.adapter for r in make_trace(_args(None), 100, n)) == zipf  # default


def test_popularity_changes_only_the_adapters() -> None:
    zipf, uniform = make_trace(_args("zipf"), 100, 8), make_trace(_args("uniform"), 100, 8)
    assert [(r.arrival, r.prompt, r.max_tokens) for r in zipf] == \
        [(r.arrival, r.prompt, r.max_tokens) for r in uniform]
