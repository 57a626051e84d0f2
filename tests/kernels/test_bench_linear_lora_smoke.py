"""`bench/linear_lora.py --smoke` (CPU, Triton interpreter): every smoke candidate of the
projection with the LoRA expand in its epilogue runs with and without adapters, and the
adapters change `y`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_linear_lora_smoke_runs_every_candidate() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "linear_lora.py"), "--smoke"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["q/k/v", "down"]
