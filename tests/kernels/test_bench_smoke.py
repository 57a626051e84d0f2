"""The device benches' `--smoke` (CPU, Triton interpreter): `bench/lora_anatomy.py` runs
every variant of the fused decode launch the GPU anatomy times, and only the rank-0 variant
leaves `y` alone; `bench/linear_lora.py` runs every smoke candidate of the projection with
the LoRA expand in its epilogue with and without adapters, and the adapters change `y`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("script", "modules"), [
    ("lora_anatomy.py", ["q/k/v", "o", "gate/up", "down"]),
    ("linear_lora.py", ["q/k/v", "down"]),
])
def test_bench_smoke_runs_every_case(script: str, modules: list[str]) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == modules
