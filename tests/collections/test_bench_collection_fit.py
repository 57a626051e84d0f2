"""bench/collection_fit.py runs end to end on a tiny collection and writes its rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_collection_fit_bench_smoke(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "collection_fit.py"), "--d", "48", "--n", "6",
         "--r0", "2", "--true-rank", "4", "--ranks", "8", "--clusters", "1", "2",
         "--iterations", "3", "--rounds", "2", "--out", str(tmp_path)],
        check=True, cwd=ROOT, capture_output=True, timeout=300)
    rows = json.loads((tmp_path / "collection_fit.json").read_text())
    assert [(r["method"], r["clusters"]) for r in rows] == [
        ("jd-full", 1), ("jd-full", 2), ("jd-diag", 1), ("jd-diag", 2)]
    for row in rows:
        assert 0.0 <= row["mean_rel_err"] <= row["max_rel_err"] <= 1.0
        assert row["params_lora"] == 6 * 2 * 96
