"""`bench/fairness.py` on the CPU (tiny random Llama, a real subprocess per scenario).

noisy: B alone, then both tenants under each policy; B's arrivals are the same in every
run and every request completes; the shares are of the service gained while both tenants
waited. policy-throughput: one trace served by fcfs and fair in alternating rounds, every
request run to its max_tokens under both. overload-ramp: every offered request is either
admitted (and meets its deadline) or expired, none left unadmitted, under every policy.
No timing is asserted: only what the bookkeeping makes exact."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--adapters", "2", "--max-num-seqs", "4", "--threads", "1", "--prompt-min", "8",
        "--prompt-max", "24", "--output-min", "2", "--output-max", "6"]


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fairness.py"), *args, "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)


def results(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads((tmp_path / name).read_text())["results"]
    return rows


def test_noisy_neighbour_bench_reports_every_policy(tmp_path: Path) -> None:
    done = bench(tmp_path, "--duration-s", "1", "--rate-b", "20", "--adapters", "2",
                 "--max-num-seqs", "8", "--threads", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = results(tmp_path, "fairness.json")
    assert [r["policy"] for r in rows] == ["B alone", "fair", "fcfs"]
    alone, fair, fcfs = rows
    assert alone["requests"]["A"] == 0 and alone["requests"]["B"] > 0
    for row in (fair, fcfs):
        assert row["requests"]["B"] == alone["requests"]["B"]
        assert row["requests"]["A"] > 5 * row["requests"]["B"]
        assert row["output_tok_s"] > 0 and "b_ttft_p99_vs_alone" in row
        share = row["b_share_backlogged"]
        assert share is None or 0.0 <= share <= 1.0


@pytest.mark.parametrize("rate", ["inf", "300"])
def test_policy_throughput_runs_the_same_trace_to_completion_under_both(
        tmp_path: Path, rate: str) -> None:
    done = bench(tmp_path, "--scenario", "policy-throughput", "--trace-adapters", "6",
                 "--tenants", "4", "--requests", "24", "--rounds", "3", "--rate", rate, *TINY)
    assert done.returncode == 0, done.stdout + done.stderr
    *runs, summary = results(tmp_path, "fairness_policy_throughput.json")
    # Alternating order: fcfs first in even rounds.
    assert [(r["policy"], r["round"]) for r in runs] == [
        ("fcfs", 0), ("fair", 0), ("fair", 1), ("fcfs", 1), ("fcfs", 2), ("fair", 2)]
    # Greedy with EOS ignored: every request finishes with exactly its max_tokens, so both
    # policies produce the same tokens every round (tok/s compares equal work).
    offered = runs[0]["offered_tokens"]
    assert offered > 24
    for r in runs:
        assert r["requests"] == r["finished"] == 24
        assert r["output_tokens"] == r["offered_tokens"] == offered
        assert r["output_tok_s"] == pytest.approx(r["output_tokens"] / r["seconds"])
    by = {(r["policy"], r["round"]): r["output_tok_s"] for r in runs}
    ratios = [by["fair", i] / by["fcfs", i] for i in range(3)]
    assert summary["policy"] == "fair / fcfs" and summary["rounds"] == 3
    assert summary["ratio_per_round"] == pytest.approx(ratios)
    assert summary["ratio_median"] == pytest.approx(statistics.median(ratios))
    assert summary["fair_tok_s_median"] == pytest.approx(
        statistics.median(by["fair", i] for i in range(3)))


def test_overload_ramp_accounts_for_every_request_under_every_policy(tmp_path: Path) -> None:
    done = bench(tmp_path, "--scenario", "overload-ramp", "--trace-adapters", "6",
                 "--ramp-s", "1", "--ramp", "0.5", "3", "--max-queue-s", "0.1",
                 "--capacity-requests", "16", *TINY)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = results(tmp_path, "fairness_overload_ramp.json")
    assert [r["policy"] for r in rows] == ["fcfs", "fair", "newest_first"]
    fcfs = rows[0]
    assert fcfs["capacity_rps"] > 0 and fcfs["offered"] > 0
    for r in rows:
        # One capacity and one arrival stream for all policies.
        assert r["capacity_rps"] == fcfs["capacity_rps"]
        assert r["offered"] == fcfs["offered"]
        # The engine's ledger: every offered request admitted or expired, none left.
        assert r["offered"] == r["admitted"] + r["expired"] and r["unadmitted"] == 0
        # ... and the outputs agree with it: an admitted request runs to its end (it met
        # its queue deadline), an expired one finished with reason "deadline".
        assert r["met"] == r["admitted"] and r["finished_by_deadline"] == r["expired"]
        assert r["goodput_rps"] == pytest.approx(r["met"] / r["seconds"])
        assert r["goodput_rps"] <= r["offered"] / r["seconds"]
        assert r["goodput_vs_fcfs"] == pytest.approx(r["goodput_rps"] / fcfs["goodput_rps"])


def test_a_ramp_from_a_zero_rate_is_refused(tmp_path: Path) -> None:
    done = bench(tmp_path, "--scenario", "overload-ramp", "--ramp", "0", "2")
    assert done.returncode == 2 and "--ramp LO HI must be finite and > 0" in done.stderr
    assert not (tmp_path / "fairness_overload_ramp.json").exists()
