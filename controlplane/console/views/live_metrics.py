"""Live numbers of one agent, read from its Prometheus `/metrics` (agent/metrics.py).

- request rate: the increase of `adapter_requests_admitted_total` (all rank buckets)
  between this scrape and the previous one of the same agent process, per second;
- TTFT p50 / p99: `adapter_ttft_seconds` (all residencies), over the requests since the
  previous scrape when there were any, else since the agent started, interpolated within
  buckets as Prometheus' `histogram_quantile` does;
- cache hit ratio: `adapter_cache_hit_ratio` (absent until the agent looked an adapter up);
- pages: `joint_pool_pages` of `{class="adapter",state="used"}`, `{class="kv",
  state="used"}` and `{class="pool",state="free"}`.

A scrape that fails (refused, timed out, not the exposition format) makes the agent's
numbers "unavailable"; nothing else on the page depends on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

ADMITTED = "adapter_requests_admitted_total"
TTFT = "adapter_ttft_seconds"
CACHE_HIT_RATIO = "adapter_cache_hit_ratio"
POOL_PAGES = "joint_pool_pages"


@dataclass(frozen=True)
class MetricsSample:
    at: float
    """Monotonic seconds of the scrape."""
    admitted: float
    ttft_buckets: tuple[tuple[float, float], ...]
    """`(le, cumulative count)` ascending by `le`, the last one `+Inf`."""
    cache_hit_ratio: float | None
    adapter_pages: int | None
    kv_pages: int | None
    free_pages: int | None


@dataclass(frozen=True)
class LiveNumbers:
    request_rate: float | None
    """None on the first scrape of an agent (a rate needs two)."""
    ttft_p50: float | None
    ttft_p99: float | None
    ttft_window: str
    """`recent` (requests since the previous scrape) or `since start`."""
    cache_hit_ratio: float | None
    adapter_pages: int | None
    kv_pages: int | None
    free_pages: int | None


class NotMetrics(ValueError):
    """The body is not Prometheus text exposition."""


def parse_metrics(text: str, at: float) -> MetricsSample:
    admitted = 0.0
    buckets: dict[float, float] = {}
    ratio: float | None = None
    pages: dict[tuple[str, str], int] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise NotMetrics(str(exc)) from exc
    for family in families:
        for sample in family.samples:
            if sample.name == ADMITTED:
                admitted += sample.value
            elif sample.name == f"{TTFT}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == CACHE_HIT_RATIO:
                ratio = sample.value
            elif sample.name == POOL_PAGES:
                key = (sample.labels.get("class", ""), sample.labels.get("state", ""))
                pages[key] = int(sample.value)
    return MetricsSample(at, admitted, tuple(sorted(buckets.items())), ratio,
                         pages.get(("adapter", "used")), pages.get(("kv", "used")),
                         pages.get(("pool", "free")))


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Prometheus' rule on cumulative `(le, count)` buckets: find the bucket holding rank
    q·total and interpolate linearly inside it (lower bound 0 for the first bucket); a
    rank in the `+Inf` bucket answers the highest finite bound. None without samples."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def _window(now: MetricsSample, before: MetricsSample | None) -> tuple[
        tuple[tuple[float, float], ...], str]:
    if before is not None and [le for le, _ in before.ttft_buckets] == [
            le for le, _ in now.ttft_buckets]:
        recent = tuple((le, count - old) for (le, count), (_, old)
                       in zip(now.ttft_buckets, before.ttft_buckets, strict=True))
        if recent and recent[-1][1] > 0 and min(count for _, count in recent) >= 0:
            return recent, "recent"
    return now.ttft_buckets, "since start"


def live_numbers(now: MetricsSample, before: MetricsSample | None) -> LiveNumbers:
    """`before`: the previous scrape of the same agent process (None: none, or the
    counters went down, i.e. the agent restarted)."""
    if before is not None and (now.admitted < before.admitted or now.at <= before.at):
        before = None
    rate = None if before is None else (now.admitted - before.admitted) / (now.at - before.at)
    buckets, window = _window(now, before)
    return LiveNumbers(rate, histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets),
                       window, now.cache_hit_ratio, now.adapter_pages, now.kv_pages,
                       now.free_pages)
