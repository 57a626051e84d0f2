"""`bench/alora.py` on the CPU (tiny random Llama, a real subprocess): the prefill work it
reports is what the prefix cache makes exact. The aLoRAs and the base requests compute
only their new tokens on top of the cached context (whole blocks of it); the ordinary
LoRAs compute the whole prompt. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16


def test_aloras_reuse_the_cached_context_and_loras_recompute_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "alora.py"), "--contexts", "40", "64", "--n",
         "1", "3", "--threads", "1", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "alora.json").read_text())["results"]
    assert [(r["t_cache"], r["n"]) for r in rows] == [(40, 1), (40, 3), (64, 1), (64, 3)]
    for r in rows:
        n, prompt = r["n"], r["t_cache"] + r["t_new"]
        cached = r["t_cache"] // BLOCK * BLOCK  # the context's full blocks
        assert r["base"]["computed_tokens"] == n * (prompt - cached)
        assert r["alora"]["computed_tokens"] == n * (prompt - cached)
        assert r["lora"]["computed_tokens"] == n * prompt
        assert r["lora"]["prefill_gflop"] > r["alora"]["prefill_gflop"] > 0
