"""`bench/zipf_residency.py` on the CPU: the real agent engine loop at tiny size, run as a
subprocess (60 adapters, 16 slots, Zipf 1.2; more adapters requested than there are slots).

Only what the bookkeeping makes exact is asserted, never a time: every offered request ends
completed or failed; the ledger looked up every queued request once; more loads than slots
were published, so idle adapters were evicted, and never more adapters sat in slots than
there are; every load started was published or failed; no bytes were first used that were
not transferred; no adapter waited for its load longer than `--starve-s` (30 s here: a
stuck load, not a slow one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SLOTS, PREFETCH = 16, 4
TINY = ["--adapters", "60", "--slots", str(SLOTS), "--prefetch", str(PREFETCH),
        "--requests", "150", "--rate", "60", "--threads", "1", "--max-num-seqs", "8",
        "--prompt-min", "8", "--prompt-max", "24", "--output-min", "2", "--output-max", "6"]
KEYS = {"requests_offered", "requests_completed", "requests_failed", "failures_by_code",
        "requests_unfinished", "output_tokens", "output_tok_s", "ttft_hit_p50_ms",
        "ttft_hit_p99_ms", "ttft_cold_p50_ms", "ttft_cold_p99_ms", "queue_wait_p50_ms",
        "queue_wait_p99_ms", "queue_wait_max_ms", "lookups", "cache_hit_rate",
        "loads_started", "loads_published", "load_attempts_failed", "evictions",
        "prefetch_published", "load_amplification", "prefetch_precision",
        "longest_load_wait_s", "starve_s", "load_starved", "loads_per_s", "host_tier_mib",
        "host_images_packed", "host_evictions", "host_images"}


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "zipf_residency.py"), *args,
         "--workdir", str(tmp_path), "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_zipf_residency_accounts_for_every_request_and_load(tmp_path: Path) -> None:
    # a host tier of 0.02 MiB holds a few of the tiny adapters' images, not all of them
    done = bench(tmp_path, *TINY, "--starve-s", "30", "--host-mib", "0.02")
    assert done.returncode == 0, done.stdout + done.stderr
    saved = json.loads((tmp_path / "out" / "zipf_residency.json").read_text())
    r: dict[str, Any] = saved["results"]
    assert set(r) >= KEYS and saved["args"]["slots"] == SLOTS
    # every offered request ended, one way or the other
    assert r["requests_offered"] == 150 and r["requests_unfinished"] == 0
    assert r["requests_completed"] + r["requests_failed"] == r["requests_offered"]
    assert sum(r["failures_by_code"].values()) == r["requests_failed"]
    # one lookup per queued request (only an overloaded one is refused before the queue)
    queued = r["requests_offered"] - r["failures_by_code"].get("OVERLOADED", 0)
    lookups = r["lookups"]
    assert lookups["base"] == 0
    assert lookups["hit"] + lookups["cold_miss"] + lookups["stale_miss"] == queued
    assert r["cache_hit_rate"] == lookups["hit"] / queued
    if r["requests_failed"] == 0:
        assert (r["hit_requests"], r["cold_requests"]) == (lookups["hit"], lookups["cold_miss"])
    # more adapters were wanted than fit: loads beyond the slots, idle ones evicted
    assert r["distinct_adapters_requested"] > SLOTS
    assert r["loads_published"] > SLOTS and r["evictions"] > 0
    assert r["loads_published"] - r["evictions"] <= SLOTS
    assert r["loads_started"] == r["loads_published"] + r["load_attempts_failed"]
    assert r["prefetch_published"] == PREFETCH
    assert 0.0 <= r["prefetch_precision"] <= 1.0
    assert r["load_amplification"] >= 1.0
    assert r["output_tokens"] > 0 and r["queue_wait_max_ms"] >= r["queue_wait_p99_ms"]
    assert r["load_starved"] == [] and r["longest_load_wait_s"] <= r["starve_s"]
    # a load packs its image unless the host tier kept it; the tier kept only a few
    assert 0 < r["host_images_packed"] <= r["loads_started"] + 1  # + the warm-up's
    assert r["host_evictions"] > 0 and r["host_images"] < r["distinct_adapters_requested"]
    assert r["host_images_packed"] - r["host_evictions"] == r["host_images"]


def test_an_open_ended_burst_is_refused(tmp_path: Path) -> None:
    done = bench(tmp_path, "--rate", "inf")
    assert done.returncode == 2 and "--rate inf needs --requests" in done.stderr
    assert not (tmp_path / "out").exists()
