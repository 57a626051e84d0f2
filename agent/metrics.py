"""Prometheus metrics of one agent.

Labels are bounded only: `phase` (prefill|decode), `rank_bucket` (le4..le256, gt256,
base), `state` (loading|active|idle|retiring), `class`/`state` of pool pages, `result`
(ok|failed of loads; hit|cold_miss|stale_miss of cache lookups), `stage`
(download|copy|validate|publish|admission|engine|digest), `reason` (rejection codes),
`residency` (base|resident|cold), `event` (the event spine's names, agent/
event_ledger.py), `use` (transferred|first_used). Never adapter, alias, request or
tenant identifiers (per-tenant service is in `/v1/agent/state` and `/v1/agent/top`).

Every counter moves at the event it reports, never earlier: loads count when the load
attempt ends (failed ones included in the latency histogram; an attempt abandoned because
nobody wants the adapter any more is counted in neither `result`), cache hits/misses at
admission, service at iteration completion.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from agent.event_ledger import EventLedger, Lookup

if TYPE_CHECKING:
    from agent.residents import ResidentSet
    from dataplane.engine.request_output import RequestOutput
    from dataplane.parallel.collectives import CollectiveCounter

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
RANK_BUCKETS = (4, 8, 16, 32, 64, 128, 256)


class FoldSlots(Protocol):
    """What the metrics read of an engine's LoRA fold slots (`model.lora_fold_slots`)."""

    @property
    def fold_slots(self) -> int: ...
    @property
    def copied(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def width_steps(self) -> Mapping[int, int]: ...
    @property
    def resident_bytes(self) -> int: ...


def rank_bucket(rank: int | None) -> str:
    """Bounded label for a LoRA rank (None = base model rows)."""
    if rank is None:
        return "base"
    for edge in RANK_BUCKETS:
        if rank <= edge:
            return f"le{edge}"
    return f"gt{RANK_BUCKETS[-1]}"


class AgentMetrics:
    """One registry per agent process (tests may build several in one interpreter)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.load_requests = Counter("adapter_load_requests_total",
                                     "Adapter load attempts started.", registry=r)
        self.load_failures = Counter("adapter_load_failures_total",
                                     "Adapter load attempts that failed.", ["stage"], registry=r)
        self.load_attempts = Counter("adapter_load_attempts_total",
                                     "Adapter load attempts by how they ended: published (ok) "
                                     "or failed and rolled back (a retry is a new attempt).",
                                     ["result"], registry=r)
        self.load_latency = Histogram("adapter_load_latency_seconds",
                                      "Load attempt duration, download to publication, failed "
                                      "attempts included.", ["result"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.h2d_bytes = Counter("adapter_h2d_bytes_total",
                                 "Adapter factor bytes copied into device slots.", registry=r)
        self.download_bytes = Counter("adapter_download_bytes_total",
                                      "Artifact bytes downloaded from object storage.",
                                      registry=r)
        self.gpu_resident_bytes = Gauge("adapter_gpu_resident_bytes",
                                        "Factor bytes of adapters resident in device slots.",
                                        registry=r)
        self.host_resident_bytes = Gauge("adapter_host_resident_bytes",
                                         "Bytes of verified artifacts in the disk cache.",
                                         registry=r)
        self.evictions = Counter("adapter_evictions_total",
                                 "Idle adapters removed from a slot to make room.", registry=r)
        self.reclaimed = Counter("adapter_retirements_total",
                                 "Cached adapters (named by no alias, held by no request) "
                                 "evicted to make room.", registry=r)
        self.pinned = Gauge("adapter_pinned_count",
                            "Resident adapters held by placement (prefetch).", registry=r)
        self.residency = Gauge("adapter_residency_state_count",
                               "Adapters per residency state.", ["state"], registry=r)
        self.pool_pages = Gauge("joint_pool_pages", "Pool units by class and state (adapter/"
                                "kv/pool pages of the unified pool; adapter slots).",
                                ["class", "state"], registry=r)
        self.distinct = Histogram("adapter_distinct_per_iteration",
                                  "Distinct adapters (base excluded) per iteration.",
                                  buckets=ROW_BUCKETS, registry=r)
        self.rows = Histogram("adapter_rows_per_iteration", "Rows per iteration by phase.",
                              ["phase"], buckets=ROW_BUCKETS, registry=r)
        self.requests_per_iter = Histogram("adapter_requests_per_iteration",
                                           "Requests per iteration by phase.", ["phase"],
                                           buckets=ROW_BUCKETS, registry=r)
        self.padding_ratio = Gauge("adapter_rank_padding_ratio",
                                   "Padded rank rows / true rank rows in the last iteration "
                                   "with adapter rows.", registry=r)
        self.admitted = Counter("adapter_requests_admitted_total", "Requests admitted.",
                                ["rank_bucket"], registry=r)
        self.rejected = Counter("adapter_requests_rejected_total", "Requests refused.",
                                ["reason"], registry=r)
        self.engine_requests = Counter(
            "adapter_engine_requests_total", "Requests the engine's scheduler was offered, "
            "admitted (first scheduled) and dropped unstarted at their queue deadline "
            "(expired).", ["outcome"], registry=r)
        self.queue_wait = Gauge("adapter_queue_wait_estimate_seconds",
                                "The scheduler's estimate of a new request's wait for its "
                                "prefill (what Retry-After says).", registry=r)
        self._engine_counts: dict[str, int] = {}
        self.unfinished = Gauge("adapter_requests_unfinished",
                                "Live requests (waiting for a load or in the engine).",
                                ["residency_state"], registry=r)
        self.ttft = Histogram("adapter_ttft_seconds", "Admission to first token.",
                              ["residency"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "prefix_cache_prompt_tokens_total",
            "Prompt tokens of started requests by where their K/V came from: computed, "
            "cached under the request's own execution, or (activated LoRA) cached base "
            "execution shared with the base model and other aLoRAs.", ["source"], registry=r)
        self.token_latency = StepHistogram("adapter_token_latency_seconds",
                                           "Interval between consecutive output tokens.",
                                           LATENCY_BUCKETS, r)
        self.slot_generation_mismatch = Counter(
            "adapter_slot_generation_mismatch_total",
            "Launches refused because a handle named a stale slot/pointer generation.",
            registry=r)
        self.page_reservations = Gauge("adapter_page_reservations",
                                       "Pool pages reserved by in-flight load transactions.",
                                       registry=r)
        self.pages_reclaimable = Gauge("adapter_pages_reclaimable",
                                       "Adapter pages an admission could reclaim now.",
                                       registry=r)
        self.publication_generation = Gauge("adapter_publication_generation",
                                            "Catalog version of the last applied desired state.",
                                            registry=r)
        self.collection_blocks = Gauge(
            "adapter_collection_blocks",
            "Basis blocks of the engine's collection tables by state (used|free).",
            ["state"], registry=r)
        self.collection_members = Gauge(
            "adapter_collection_members",
            "Slots serving a collection member natively (shared bases + own core).",
            registry=r)
        self.collection_resident_bytes = Gauge(
            "adapter_collection_resident_bytes",
            "Device bytes of the resident collections' bases and members' cores.",
            registry=r)

    def watch_collectives(self, counter: CollectiveCounter) -> None:
        """Export a TP rank's collective ledger (read at scrape time):
        `adapter_tp_collective_calls_total` and `adapter_tp_collective_bytes_total` (this
        rank's payload bytes) by `purpose` (base|lora|control|tokens) and `kind`."""
        self.registry.register(_CollectiveCollector(counter))

    def watch_events(self, ledger: EventLedger) -> None:
        """Export the event spine (agent/event_ledger.py, read at scrape time):
        `adapter_events_total{event}`, `adapter_cache_lookups_total{result}` (hit |
        cold_miss | stale_miss), `adapter_load_bytes_total{use}` (transferred: every
        attempt; first_used: by a completed request), `adapter_prefetch_wasted_*_total`
        (pages, bytes, seconds of prefetched generations that left unused), and the
        ratios `adapter_cache_hit_ratio`, `adapter_prefetch_precision`,
        `adapter_load_amplification`, `adapter_rejected_ratio` (absent until defined)."""
        self.registry.register(_EventCollector(ledger))

    def watch_fold(self, slots: FoldSlots) -> None:
        """Export the LoRA fold's slots (read at scrape time): `adapter_lora_fold_slots`
        (adapters the fold holds at most), `adapter_lora_fold_copies_total` (adapters
        copied into it on a decode step that needed one it lacked: its churn),
        `adapter_lora_fold_capacity` (fold slots in use),
        `adapter_lora_fold_width_steps_total{width}` (steps by fold slots read) and
        `adapter_lora_fold_resident_bytes` (device bytes of the fold's own copies)."""
        self.registry.register(_FoldCollector(slots))

    def observe_collections(self, blocks_used: int, blocks_total: int, members: int,
                            resident_bytes: int) -> None:
        """Gauges of natively served collections (engines with collection blocks)."""
        self.collection_blocks.labels("used").set(blocks_used)
        self.collection_blocks.labels("free").set(blocks_total - blocks_used)
        self.collection_members.set(members)
        self.collection_resident_bytes.set(resident_bytes)

    def observe_prompt(self, out: RequestOutput) -> None:
        """A request's first output: split its prompt tokens by the prefix cache's part."""
        base = out.num_cached_base_tokens
        own = out.num_cached_tokens - base
        computed = len(out.prompt_token_ids) - out.num_cached_tokens
        for source, n in (("computed", computed), ("cached_same_execution", own),
                          ("cached_base_for_alora", base)):
            if n:
                self.prompt_tokens.labels(source).inc(n)

    def observe_admission(self, counts: dict[str, int], wait_s: float) -> None:
        """The engine's offered / admitted / expired counts (cumulative) and wait estimate."""
        for outcome, n in counts.items():
            new = n - self._engine_counts.get(outcome, 0)
            if new > 0:
                self.engine_requests.labels(outcome).inc(new)
        self._engine_counts = dict(counts)
        self.queue_wait.set(wait_s)

    def observe_loop(self, residents: ResidentSet, pool: dict[str, dict[str, int]],
                     kv_free: int, kv_total: int, live: int, downloaded: int,
                     downloaded_seen: int) -> int:
        """Gauges from the engine loop's state (called after every loop iteration);
        returns the download byte count now accounted for."""
        pages = pool.get("pages", {})
        if pages:  # unified pool: one page ledger for adapter factors and KV blocks
            self.pool_pages.labels("adapter", "used").set(pages.get("adapter", 0))
            self.pool_pages.labels("adapter", "reserved").set(pages.get("reserved", 0))
            self.pool_pages.labels("pool", "free").set(pages.get("free", 0))
        self.page_reservations.set(pages.get("reserved", 0))
        self.pages_reclaimable.set(pool.get("reclaimable", {}).get("pages", 0))
        if downloaded > downloaded_seen:
            self.download_bytes.inc(downloaded - downloaded_seen)
        for state, n in residents.state_counts().items():
            self.residency.labels(state).set(n)
        in_slots = residents.in_slots()
        self.gpu_resident_bytes.set(sum(r.factor_bytes for r in in_slots))
        self.pinned.set(sum(1 for r in in_slots if r.prefetch))
        self.pool_pages.labels("adapter_slot", "used").set(len(in_slots))
        self.pool_pages.labels("adapter_slot", "free").set(residents.free_slots)
        self.pool_pages.labels("kv", "obtainable").set(kv_free)
        self.pool_pages.labels("kv", "used").set(pages["kv"] if pages else kv_total - kv_free)
        self.unfinished.labels("active").set(live)
        self.unfinished.labels("loading").set(
            sum(len(r.waiting) for r in residents.by_digest.values()))
        return max(downloaded, downloaded_seen)


class StepHistogram:
    """A histogram observed a step's values at a time: one lock and a bisect per value.

    The token-interval histogram gets a value per row per step on the engine thread (256
    at a 256-row decode step); prometheus_client's `Histogram.observe` takes a lock and
    scans the buckets for each (~2 us). Exposed as a standard histogram (`_bucket`,
    `_count`, `_sum`); a scrape reads one consistent snapshot."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[float],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = tuple(sorted(float(b) for b in buckets))
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: Iterable[float]) -> None:
        bounds, counts = self._bounds, self._counts
        with self._lock:
            total = self._sum
            for v in values:
                counts[bisect_left(bounds, v)] += 1  # first bound >= v: Prometheus' `le`
                total += v
            self._sum = total

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, n in zip((*self._bounds, math.inf), counts, strict=True):
            cumulative += n
            buckets.append((floatToGoString(bound), cumulative))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets,
                                    sum_value=total)


class _FoldCollector:
    """Prometheus collector over a model's `FoldSlots`."""

    def __init__(self, slots: FoldSlots) -> None:
        self.slots = slots

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily("adapter_lora_fold_slots",
                                 "Adapters the LoRA fold of decode steps holds at most.")
        held.add_metric([], self.slots.fold_slots)
        copies = CounterMetricFamily("adapter_lora_fold_copies",
                                     "Adapters copied into the LoRA fold for a decode step.")
        copies.add_metric([], self.slots.copied)
        capacity = GaugeMetricFamily("adapter_lora_fold_capacity",
                                     "Fold slots in use: the widest a decode step may read.")
        capacity.add_metric([], self.slots.capacity)
        widths = CounterMetricFamily("adapter_lora_fold_width_steps",
                                     "Folded decode steps by the fold slots their GEMMs read.",
                                     labels=["width"])
        for width, steps in self.slots.width_steps.items():
            widths.add_metric([str(width)], steps)
        resident = GaugeMetricFamily("adapter_lora_fold_resident_bytes",
                                     "Device bytes of the LoRA fold's copies of factors.")
        resident.add_metric([], self.slots.resident_bytes)
        yield held
        yield copies
        yield capacity
        yield widths
        yield resident


class _EventCollector:
    """Prometheus collector over the agent's `EventLedger` (labels: event, result, use)."""

    def __init__(self, ledger: EventLedger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        led = self.ledger
        events = CounterMetricFamily("adapter_events", "Serving events published, by event.",
                                     labels=["event"])
        for event, n in list(led.counts.items()):
            events.add_metric([event.value], n)
        lookups = CounterMetricFamily("adapter_cache_lookups", "Admissions of adapter "
                                      "requests by what they found: the leased generation "
                                      "resident (hit), nothing (cold_miss), or another "
                                      "generation of the alias (stale_miss).",
                                      labels=["result"])
        for lookup, n in list(led.lookups.items()):
            if lookup is not Lookup.BASE:
                lookups.add_metric([lookup.value], n)
        loaded = CounterMetricFamily("adapter_load_bytes", "Adapter bytes transferred by "
                                     "every load attempt (transferred) and of the loaded "
                                     "generations a completed request used (first_used).",
                                     labels=["use"])
        loaded.add_metric(["transferred"], led.bytes_transferred)
        loaded.add_metric(["first_used"], led.bytes_first_used)
        yield from (events, lookups, loaded)
        for name, value, doc in (
                ("pages", led.prefetch_wasted_pages, "Pages"),
                ("bytes", led.prefetch_wasted_bytes, "Bytes"),
                ("seconds", led.prefetch_wasted_seconds, "Resident seconds")):
            wasted = CounterMetricFamily(f"adapter_prefetch_wasted_{name}",
                                         f"{doc} of prefetched adapter generations that left "
                                         "their slot without serving a completed request.")
            wasted.add_metric([], value)
            yield wasted
        for name, ratio, doc in (
                ("adapter_cache_hit_ratio", led.cache_hit_rate(),
                 "Hits / (hits + cold misses + stale misses)."),
                ("adapter_prefetch_precision", led.prefetch_precision(),
                 "Prefetched generations used before they left / prefetched published."),
                ("adapter_load_amplification", led.load_amplification(),
                 "Adapter bytes transferred / bytes first used by completed requests."),
                ("adapter_rejected_ratio", led.rejected_ratio(),
                 "Requests rejected at admission / requests offered.")):
            if ratio is not None:
                yield GaugeMetricFamily(name, doc, value=ratio)


class _CollectiveCollector:
    """Prometheus collector over a `CollectiveCounter` (bounded labels: purpose, kind)."""

    def __init__(self, counter: CollectiveCounter) -> None:
        self.counter = counter

    def collect(self) -> Iterator[Metric]:
        calls = CounterMetricFamily("adapter_tp_collective_calls",
                                    "Tensor-parallel collective calls of this rank.",
                                    labels=["purpose", "kind"])
        nbytes = CounterMetricFamily("adapter_tp_collective_bytes",
                                     "Payload bytes this rank handed to collectives.",
                                     labels=["purpose", "kind"])
        for (purpose, kind), tally in sorted(self.counter.tallies().items()):
            calls.add_metric([purpose, kind], tally.calls)
            nbytes.add_metric([purpose, kind], tally.payload_bytes)
        yield calls
        yield nbytes
