"""`bench/decode_step.py` runs end to end on CPU (tiny random Llama, float32, a real
subprocess): one row per adapter count and loop, each against its HBM floor; `--host`
times the graph path's host work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--max-num-seqs", "4", "--prompt-max", "16", "--adapters", "2", "--kv-blocks", "64",
         "--steps", "3", "--threads", "1"]


def run(tmp_path: Path, *extra: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "decode_step.py"), *SMALL, *extra,
         "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return list(json.loads((tmp_path / "decode_step.json").read_text())["results"])


def test_decode_step_bench_tiny_cpu(tmp_path: Path) -> None:
    rows = run(tmp_path, "--shape", "tiny", "--device", "cpu", "--dtype", "float32",
               "--scheduling", "sync", "async", "--fold")
    assert [(r["adapters"], r["scheduling"], r["fold"]) for r in rows] == [
        (0, "sync", False), (0, "async", False), (2, "sync", True), (2, "async", True)]
    for r in rows:
        assert r["step_ms"] > 0 and r["floor_ms"] > 0
        assert r["ratio"] == pytest.approx(r["step_ms"] / r["floor_ms"])
        assert (r["overlapped_steps"] > 0) == (r["scheduling"] == "async")
    # the floor counts the step's distinct adapters' factors: 2 adapters read more bytes
    assert rows[2]["floor_ms"] > rows[0]["floor_ms"]


def test_decode_step_bench_host_only(tmp_path: Path) -> None:
    rows = run(tmp_path, "--host")
    assert [r["adapters"] for r in rows] == [0, 2]
    assert all(r["step_ms"] > 0 for r in rows)
