"""Live numbers: parsing a real agent registry's exposition (agent/metrics.py), the
quantile rule, and the agents' live fragment over HTTP (one agent serving metrics, one
refusing connections)."""

from __future__ import annotations

import re
import time

import httpx
from prometheus_client import generate_latest

from controlplane.console.views.live_metrics import (
    MetricsSample,
    histogram_quantile,
    live_numbers,
    parse_metrics,
)
from tests.console.console_client import login
from tests.console.seed import Seeded, observed_metrics

# By hand from the observations (60 at 3 ms, 40 at 30 ms) and LATENCY_BUCKETS: p50 is
# rank 50 in bucket (2.5 ms, 5 ms] holding ranks 1-60, p99 rank 99 in (25 ms, 50 ms]
# holding ranks 61-100; Prometheus interpolates linearly inside the bucket.
P50_S = 0.0025 + (0.005 - 0.0025) * 50 / 60
P99_S = 0.025 + (0.05 - 0.025) * (99 - 60) / 40


def test_parse_real_agent_exposition() -> None:
    sample = parse_metrics(generate_latest(observed_metrics().registry).decode(), at=10.0)
    assert sample.admitted == 100
    assert sample.ttft_buckets[-1] == (float("inf"), 100)
    assert dict(sample.ttft_buckets)[0.005] == 60
    assert (sample.adapter_pages, sample.kv_pages, sample.free_pages) == (40, 100, 116)
    assert sample.cache_hit_ratio == 0.75
    numbers = live_numbers(sample, None)
    assert numbers.request_rate is None and numbers.ttft_window == "since start"
    assert abs(numbers.ttft_p50 - P50_S) < 1e-12  # type: ignore[operator]
    assert abs(numbers.ttft_p99 - P99_S) < 1e-12  # type: ignore[operator]


def test_rate_and_recent_window_between_two_samples() -> None:
    before = MetricsSample(1.0, 100, ((0.01, 60), (0.1, 100), (float("inf"), 100)), None,
                           None, None, None)
    now = MetricsSample(3.0, 140, ((0.01, 60), (0.1, 130), (float("inf"), 140)), None,
                        None, None, None)
    numbers = live_numbers(now, before)
    assert numbers.request_rate == 20.0  # 40 requests in 2 s
    # the 40 recent requests: 30 in (10 ms, 100 ms], 10 above the highest finite bound
    assert numbers.ttft_window == "recent"
    assert numbers.ttft_p50 == 0.01 + (0.1 - 0.01) * 20 / 30
    assert numbers.ttft_p99 == 0.1
    # a restarted agent (counters went down) has no rate yet
    restarted = MetricsSample(4.0, 5, ((0.01, 5), (0.1, 5), (float("inf"), 5)), None, None,
                              None, None)
    assert live_numbers(restarted, now).request_rate is None


def test_quantile_edges() -> None:
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.1, 0), (float("inf"), 0)]) is None
    assert histogram_quantile(0.5, [(0.1, 4), (float("inf"), 4)]) == 0.05


def _live_row(html: str, name: str) -> str:
    row = re.search(rf"<tr>\s*<th scope=\"row\"><a href=\"/ui/agents/\d+\">{name}</a></th>"
                    r"(.*?)</tr>", html, re.S)
    assert row is not None, html
    return row.group(1)


def test_live_fragment_scrapes_agents(seeded: Seeded) -> None:
    seeded.heartbeat()
    client = login(seeded.url, seeded.admin)
    try:
        first = client.get("/ui/agents/live")
        assert first.status_code == 200
        gpu_a, gpu_b = _live_row(first.text, "gpu-a"), _live_row(first.text, "gpu-b")
        assert "unavailable: scrape failed (ConnectError)" in gpu_b
        cells = re.findall(r'<td class="num">(.*?)</td>', gpu_a, re.S)
        assert cells[1] == f"{P50_S * 1000:.1f} ms" and cells[2].startswith(
            f"{P99_S * 1000:.1f} ms")
        assert cells[3] == "75.0 %" and cells[4:] == ["40", "100", "116"]
        # 50 more admissions between two polls: the rate is 50 / (the time between the
        # two scrapes), which lies between the inner and outer times of the two polls
        started = time.monotonic()
        client.get("/ui/agents/live")
        inner_start = time.monotonic()
        for _ in range(50):
            seeded.metrics.admitted.labels("le4").inc()
        time.sleep(0.05)
        inner_end = time.monotonic()
        second = client.get("/ui/agents/live")
        outer = time.monotonic() - started
        rate = float(re.findall(r'<td class="num">(.*?)</td>',
                                _live_row(second.text, "gpu-a"), re.S)[0])
        assert 50 / outer - 0.01 <= rate <= 50 / (inner_end - inner_start) + 0.01
        page = client.get("/ui/agents")
        assert 'hx-get="/ui/agents/live"' in page.text and "every 5s" in page.text
    finally:
        client.close()


def test_reader_without_global_read_cannot_see_agents(seeded: Seeded) -> None:
    client = login(seeded.url, seeded.reader)
    try:
        for path in ("/ui/agents", "/ui/agents/live", f"/ui/agents/{seeded.agents['gpu-a']}"):
            refused = client.get(path)
            assert refused.status_code == 403 and "FORBIDDEN" in refused.text, path
    finally:
        client.close()


def test_agent_page_shows_residency_and_failures(seeded: Seeded) -> None:
    client = login(seeded.url, seeded.admin)
    try:
        page = client.get(f"/ui/agents/{seeded.agents['gpu-a']}")
        assert page.status_code == 200
        b = seeded.artifacts["b"]
        assert f"#{b['id']} <code>{b['digest'][:12]}</code>" in page.text
        assert "CUDA out of memory" in page.text and "<td>copy</td>" in page.text
        assert "116 of 256 pages free for KV" in page.text
    finally:
        client.close()
    assert httpx.get(f"{seeded.url}/ui/agents", follow_redirects=False).status_code == 303
