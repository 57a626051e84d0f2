"""StepHistogram (agent/metrics.py) exposes what prometheus_client's Histogram exposes for
the same observations: values on every bucket bound, between, above the last, zero."""

from __future__ import annotations

import random
import threading

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from agent.metrics import LATENCY_BUCKETS, StepHistogram


def _samples(registry: CollectorRegistry, name: str) -> list[str]:
    text = generate_latest(registry).decode()
    return [line.replace(name, "h") for line in text.splitlines()
            if line.startswith(name) and "_created" not in line]


def test_exposition_equals_prometheus_client_histogram() -> None:
    rng = random.Random(3)
    registry = CollectorRegistry()
    ours = StepHistogram("ours_seconds", "doc", LATENCY_BUCKETS, registry)
    ref = Histogram("ref_seconds", "doc", buckets=LATENCY_BUCKETS, registry=registry)
    steps = [list(LATENCY_BUCKETS), [0.0, 31.0, 1e9], []]
    steps += [[rng.uniform(0, 40) ** 3 / 1600 for _ in range(rng.randrange(1, 300))]
              for _ in range(20)]
    for values in steps:
        ours.observe_many(values)
        for v in values:
            ref.observe(v)
        assert _samples(registry, "ours_seconds") == _samples(registry, "ref_seconds")
    assert any('le="+Inf"} ' in line for line in _samples(registry, "ours_seconds"))


def test_concurrent_steps_and_scrapes_stay_consistent() -> None:
    """A scrape during observation sees a snapshot: count == +Inf bucket, every bucket
    cumulative."""
    registry = CollectorRegistry()
    ours = StepHistogram("c_seconds", "doc", LATENCY_BUCKETS, registry)
    done = threading.Event()

    def observe() -> None:
        for _ in range(2000):
            ours.observe_many([0.003, 0.2, 7.0])
        done.set()

    thread = threading.Thread(target=observe)
    thread.start()
    while not done.is_set():
        family = next(iter(ours.collect()))
        buckets = [s.value for s in family.samples if s.name.endswith("_bucket")]
        count = next(s.value for s in family.samples if s.name.endswith("_count"))
        assert buckets == sorted(buckets) and buckets[-1] == count and count % 3 == 0
    thread.join()
    family = next(iter(ours.collect()))
    assert next(s.value for s in family.samples if s.name.endswith("_count")) == 6000
