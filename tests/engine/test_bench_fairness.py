"""`bench/fairness.py` on the CPU (tiny random Llama, a real subprocess): B alone, then
both tenants under each policy; B's arrivals are the same in every run and every request
completes; the shares are of the service gained while both tenants waited."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_noisy_neighbour_bench_reports_every_policy(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fairness.py"), "--duration-s", "1",
         "--rate-b", "20", "--adapters", "2", "--max-num-seqs", "8", "--threads", "1",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "fairness.json").read_text())["results"]
    assert [r["policy"] for r in rows] == ["B alone", "fair", "fcfs"]
    alone, fair, fcfs = rows
    assert alone["requests"]["A"] == 0 and alone["requests"]["B"] > 0
    for row in (fair, fcfs):
        assert row["requests"]["B"] == alone["requests"]["B"]
        assert row["requests"]["A"] > 5 * row["requests"]["B"]
        assert row["output_tok_s"] > 0 and "b_ttft_p99_vs_alone" in row
        share = row["b_share_backlogged"]
        assert share is None or 0.0 <= share <= 1.0
