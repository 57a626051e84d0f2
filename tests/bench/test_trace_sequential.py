"""bench/trace.py --rounds --sequential: the LoRA rounds, then the LoRA engine released and
the no-LoRA rounds on the same model (for a card that cannot hold both engines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sequential_rounds_run_both_arms_on_one_model(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "trace.py"), "--mode", "cuda", "--device", "cpu",
           "--dtype", "float32", "--shape", "tiny", "--adapters", "4", "--requests", "8",
           "--prompt-min", "16", "--prompt-max", "32", "--output-min", "8", "--output-max", "16",
           "--max-num-seqs", "4", "--max-batched-tokens", "64", "--kv-blocks", "64",
           "--skip-hf", "--rounds", "2", "--sequential", "--fold", "on", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "trace_results.json").read_text())["results"]
    assert [(r["round"], r["adapters"]) for r in rows] == [(0, 4), (0, 0), (1, 4), (1, 0)]
    lora, base = rows[0], rows[1]
    assert lora["fold"] and lora["folded_steps"] > 0 and not base["fold"]
    assert lora["overlapped_steps"] == base["overlapped_steps"] == 0  # CPU: synchronous
    expected = sum(r["output_tokens"] for r in rows) // 4
    assert all(r["output_tokens"] == expected > 0 for r in rows)
    assert "ratio per round" in done.stderr
