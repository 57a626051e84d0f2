"""bench/collection_serving.py runs end to end on the tiny shape and writes its rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_collection_serving_bench_smoke(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "collection_serving.py"), "--shape", "tiny",
         "--device", "cpu", "--dtype", "float32", "--members", "3", "--clusters", "2",
         "--batch", "4", "--context", "16", "--steps", "2", "--rank", "4",
         "--kv-blocks", "64", "--out", str(tmp_path)],
        check=True, cwd=ROOT, capture_output=True, timeout=300)
    rows = json.loads((tmp_path / "collection_serving.json").read_text())
    assert [(r["mode"], r["members"]) for r in rows] == [
        ("none", 0), ("native", 3), ("native+lora", 3), ("lora", 3)]
    native, lora = rows[1], rows[3]
    assert native["distinct_per_step"] == lora["distinct_per_step"] == 3
    assert all(r["step_ms"] > 0 for r in rows)
    # tiny shape: (d_in + d_out) over q, k, v, o, gate, up, down = 1,024; 2 layers; fp32
    assert lora["resident_mb"] * 2**20 == 3 * 4 * 1024 * 2 * 4
