"""The device benches' `--smoke` modes (CPU, Triton interpreter).

`bench/lora_anatomy.py`: every variant of the fused decode launch the GPU anatomy times
runs, and only the rank-0 variant leaves `y` alone. `bench/lora_fold_probe.py`: the probe's
folded norm + row shrink and row expand match float64 torch (and the unfolded pass leaves
`y` alone), for every tile it times. `bench/lora_concat_probe.py`: its concatenated-K way
leaves a mixed step's prefill rows as the wide GEMM wrote them and updates every decode
row. `bench/lora_mlp_fold_probe.py`: its gate/up + SiLU + down-shrink launch, its SiLU·mul with
row partials of the down shrink, and the down expand reproduce what today's path's LoRA
changes in the activation and the down output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("bench", "modules"), [
    ("lora_anatomy.py", ["q/k/v", "o", "gate/up", "down"]),
    ("lora_fold_probe.py", ["q/k/v", "down"]),
    ("lora_concat_probe.py", ["q/k/v"]),
    ("lora_mlp_fold_probe.py", ["smoke"]),
])
def test_bench_smoke(bench: str, modules: list[str]) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / bench), "--smoke"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == modules
