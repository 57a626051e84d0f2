"""`bench/lora_anatomy.py --smoke` (CPU, Triton interpreter): every variant of the fused
decode launch the GPU anatomy times runs, and only the rank-0 variant leaves `y` alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_anatomy_smoke_runs_every_variant() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "lora_anatomy.py"), "--smoke"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == [
        "q/k/v", "o", "gate/up", "down"]
