"""bench/serving.py against a real agent: an embedded control plane (SQLite) and one CPU
agent on a tiny random Llama with two published adapters (`bench.load_profile.seed`).

The client must count what the server did: every request yields exactly `output_len`
tokens (in at most that many streamed chunks: one per engine output of the sample,
which may carry more than one token), TTFT comes before the end, the JSON result has the
documented shape, greedy tokens repeat run to run, errors are counted by status and code,
and constant arrivals are spaced by 1 / rate.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import serving, serving_hf
from bench.load_profile import seed
from bench.serving_compare import compare_rows, compare_runs, read_tokens
from bench.serving_workload import SHAREGPT, WorkloadSpec, make_workload, popularity_weights
from cli.stack import EmbeddedStack


@dataclass(frozen=True)
class Served:
    url: str
    token: str
    models: list[str]
    work: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("serving-client")
    with EmbeddedStack(work / "cp", port=0, embedded_only=True) as stack:
        env, agent = seed(stack, work, 2)
        try:
            names = json.loads(env["LOAD_ALIASES"])
            yield Served(agent.url, env["LOAD_READER_TOKEN"],
                         [f"{env['LOAD_NAMESPACE']}/{n}" for n in names], work)
        finally:
            agent.stop()


def run(served: Served, tmp: Path, name: str, *extra: str) -> dict:
    argv = ["--base-url", served.url, "--api-key", served.token,
            "--models", ",".join(served.models), "--vocab-size", "256", "--min-token-id", "3",
            "--input-len", "12", "--output-len", "5", "--num-requests", "6",
            "--max-concurrency", "3", "--out", str(tmp / f"{name}.json"),
            "--save-tokens", str(tmp / f"{name}.tokens.jsonl"), *extra]
    doc = serving.benchmark(serving.parse_args(argv))
    written = json.loads((tmp / f"{name}.json").read_text())  # NaN where nothing completed
    assert written.keys() == doc.keys() and written["requests"] == doc["requests"]
    assert written["summary"]["errors"] == doc["summary"]["errors"]
    return doc


def test_counts_and_metrics_match_what_the_agent_streamed(served: Served,
                                                          tmp_path: Path) -> None:
    doc = run(served, tmp_path, "a")
    s = doc["summary"]
    assert doc["schema"] == serving.SCHEMA and doc["loadavg_before"] and doc["loadavg_after"]
    assert (s["requests"], s["completed"], s["failed"], s["errors"]) == (6, 6, 0, {})
    assert s["short_outputs"] == 0
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (6 * 12, 6 * 5)
    assert s["output_throughput"] == pytest.approx(30 / s["duration_s"])
    assert s["request_throughput"] == pytest.approx(6 / s["duration_s"])
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        d = s[key]
        assert 0 < d["p50"] <= d["p90"] <= d["p99"], (key, d)
    assert s["ttft_ms"]["p99"] <= s["e2el_ms"]["p99"]
    for r in doc["requests"]:
        assert r["error"] is None and r["model"] in served.models
        assert (r["prompt_len"], r["output_tokens"]) == (12, 5)
        assert 1 <= r["chunks"] <= 5
        assert 0 < r["ttft_s"] <= r["latency_s"] <= s["duration_s"]
        assert r["tpot_s"] == pytest.approx((r["latency_s"] - r["ttft_s"]) / 4)
    rows = [json.loads(line) for line in (tmp_path / "a.tokens.jsonl").read_text().splitlines()]
    workload = make_workload(serving.workload_spec(serving.parse_args(
        ["--base-url", "x", "--models", ",".join(served.models), "--vocab-size", "256",
         "--min-token-id", "3", "--input-len", "12", "--output-len", "5",
         "--num-requests", "6"])))
    assert [r["prompt"] for r in rows] == [w.prompt for w in workload]
    assert all(len(r["token_ids"]) == 5 for r in rows)
    again = run(served, tmp_path, "b")  # greedy: the same tokens for the same workload
    assert again["summary"]["completed"] == 6
    same = compare_runs(tmp_path / "a.tokens.jsonl", tmp_path / "b.tokens.jsonl")
    assert (same["compared"], same["identical"]) == (6, 6)


def test_errors_are_counted_by_status_and_code(served: Served, tmp_path: Path) -> None:
    ns = served.models[0].split("/")[0]
    doc = run(served, tmp_path, "bad", "--models", f"{ns}/no-such-alias")
    s = doc["summary"]
    assert (s["completed"], s["failed"]) == (0, 6)
    [(key, count)] = s["errors"].items()
    assert key.startswith("http_404:") and count == 6


def test_constant_arrivals_are_spaced_by_one_over_the_rate(served: Served,
                                                           tmp_path: Path) -> None:
    doc = run(served, tmp_path, "rate", "--request-rate", "10", "--arrival", "constant",
              "--max-concurrency", "0")
    sent = [r["sent_s"] for r in doc["requests"]]
    # request i arrives at i / rate: none is sent before it (a loaded host may send one
    # late, so single gaps are not bounded) and none long after it
    assert all(i * 0.1 - 0.002 <= s < i * 0.1 + 0.25 for i, s in enumerate(sent))
    assert doc["summary"]["completed"] == 6


def test_workloads_are_fixed_by_the_seed() -> None:
    spec = WorkloadSpec(dataset="sharegpt-like", num_requests=200, models=("a", "b", "c"),
                        popularity="zipf:1.5", request_rate=4.0, seed=3)
    one, two = make_workload(spec), make_workload(spec)
    assert one == two
    assert all(SHAREGPT.min_len <= len(r.prompt) <= SHAREGPT.max_len for r in one)
    assert len({len(r.prompt) for r in one}) > 50  # lengths vary
    counts = [sum(r.model_index == k for r in one) for k in range(3)]
    assert counts[0] > counts[1] > counts[2]  # zipf: the first model is the most popular
    assert popularity_weights("zipf:1.5", 3)[0] == pytest.approx(1 / (1 + 2**-1.5 + 3**-1.5))
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(one)]
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.2)  # Poisson, mean 1 / rate
    assert math.isinf(WorkloadSpec().request_rate)
    assert all(r.arrival_s == 0 for r in make_workload(WorkloadSpec(models=("a",))))


def test_hf_peft_arm_runs_the_same_workload_and_matches_the_agent(served: Served,
                                                                  tmp_path: Path) -> None:
    """bench/serving_hf.py (HF + PEFT, mixed batches) on the workload the client sent:
    the same prompts and adapter per request, and the agent's greedy tokens equal it."""
    run(served, tmp_path, "agent")
    serving_hf.main(["--model-dir", str(served.work / "base"),
                     "--adapter", str(served.work / "a0"), "--adapter", str(served.work / "a1"),
                     "--vocab-size", "256", "--min-token-id", "3", "--input-len", "12",
                     "--output-len", "5", "--num-requests", "6", "--batch", "4",
                     "--out", str(tmp_path / "hf.json")])
    doc = json.loads((tmp_path / "hf.json").read_text())
    assert doc["summary"]["output_tokens"] == 6 * 5 and doc["summary"]["output_throughput"] > 0
    check = compare_rows(read_tokens(tmp_path / "agent.tokens.jsonl"), doc["rows"])
    assert check["compared"] == 6 and check["identical"] == 6, check
