"""/metrics: the exported metric names, only bounded label values, no raw identities."""

from __future__ import annotations

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agent.event_ledger import Event

from .conftest import Deployment
from .test_inference_api import complete

REQUIRED = {
    "adapter_load_requests_total", "adapter_load_failures_total", "adapter_load_attempts_total",
    "adapter_load_latency_seconds", "adapter_h2d_bytes_total", "adapter_gpu_resident_bytes",
    "adapter_host_resident_bytes", "adapter_cache_lookups_total", "adapter_events_total",
    "adapter_load_bytes_total", "adapter_prefetch_wasted_bytes_total",
    "adapter_cache_hit_ratio", "adapter_load_amplification",
    "adapter_evictions_total", "adapter_pinned_count", "adapter_residency_state_count",
    "joint_pool_pages", "adapter_distinct_per_iteration", "adapter_rows_per_iteration",
    "adapter_rank_padding_ratio", "adapter_ttft_seconds", "adapter_token_latency_seconds",
    "adapter_slot_generation_mismatch_total", "adapter_page_reservations",
    "adapter_pages_reclaimable", "adapter_publication_generation",
    "prefix_cache_prompt_tokens_total",
}
"""The default CPU agent keeps its LoRA launches (`lora_fold=auto` is off on the CPU); the
fold's metrics are checked where an agent folds (test_tp_agent_process.py)."""
BOUNDED = {
    "phase": {"prefill", "decode"},
    "state": {"loading", "active", "idle", "retiring", "cached", "used", "free", "reserved",
              "obtainable"},
    "class": {"kv", "adapter_slot", "adapter", "pool"},
    "result": {"ok", "failed", "hit", "cold_miss", "stale_miss"},
    "stage": {"download", "copy", "validate", "publish", "admission", "engine", "digest"},
    "residency": {"base", "resident", "cold"},
    "residency_state": {"active", "loading"},
    "rank_bucket": {"base", "le4", "le8", "le16", "le32", "le64", "le128", "le256", "gt256"},
    "outcome": {"offered", "admitted", "expired"},
    "event": {e.value for e in Event},
    "use": {"transferred", "first_used"},
    "source": {"computed", "cached_same_execution", "cached_base_for_alora"},
}


def test_metrics_names_and_bounded_labels(deployment: Deployment) -> None:
    ns = deployment.namespace
    for alias in ("a", "b", "c"):
        complete(deployment, f"{ns}/{alias}", [3, 4, 5])
    text = httpx.get(f"{deployment.agent.url}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    names = {f.name for f in families.values()} | {
        f.name + "_total" for f in families.values() if f.type == "counter"}
    assert names >= REQUIRED, REQUIRED - names
    for family in families.values():
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label in ("le", "quantile"):
                    continue
                if label == "reason":
                    assert re.fullmatch(r"[a-z_]{1,40}", value), value
                    continue
                assert value in BOUNDED[label], (sample.name, label, value)
    for art in deployment.artifacts.values():  # no raw identities anywhere
        assert art["digest"] not in text
    assert ns not in text
    lookups = {s.labels["result"]: s.value for s in families["adapter_cache_lookups"].samples
               if s.name.endswith("_total")}
    assert set(lookups) == {"hit", "cold_miss", "stale_miss"}
    assert sum(lookups.values()) >= 3
    rows = [s for s in families["adapter_rows_per_iteration"].samples
            if s.name.endswith("_count") and s.labels["phase"] == "prefill"]
    assert rows and rows[0].value >= 1


def test_adapters_live_in_pool_pages(deployment: Deployment) -> None:
    """The default residency backend keeps factors in the unified page pool: every
    resident adapter owns pages and a published slot; nothing is left reserved."""
    state = deployment.agent.state()
    resident = [s for s in state["slots"] if s["state"] in ("active", "idle")]
    pool = state["pool"]
    assert resident and pool["pages"]["adapter"] > 0
    assert pool["pages"]["reserved"] == 0
    assert pool["residency"]["published"] + pool["residency"]["active"] + pool["residency"][
        "idle"] >= len(resident)
    assert pool["slots"]["published"] == len(resident)


def test_every_metric_is_documented(deployment: Deployment) -> None:
    """docs/METRICS.md lists every metric a running agent exports, and only metrics the
    agent defines."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "METRICS.md").read_text().split("## Every metric")[1]
    documented = set(re.findall(r"^\| `((?:adapter|joint)_[a-z0-9_]+)` \|", doc, re.M))
    text = httpx.get(f"{deployment.agent.url}/metrics", timeout=10).text
    exported = {f.name + ("_total" if f.type == "counter" else "")
                for f in text_string_to_metric_families(text)}
    exported = {n for n in exported if n.startswith(("adapter_", "joint_"))
                and not n.endswith("_created")}
    assert exported <= documented, exported - documented
    source = (root / "agent" / "metrics.py").read_text()
    defined = {n for n in documented if n.removesuffix("_total") in source
               or n.startswith("adapter_prefetch_wasted_")}
    assert defined == documented, documented - defined
