"""`bench/sampling.py` on the CPU (tiny random Llama, a real subprocess): every scenario is
measured against the argmax floor and the featureless sampler of the same run. No timing
is asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_scenario_reports_ratios_of_the_same_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sampling.py"), "--batch", "4", "--ctx", "8",
         "--steps", "3", "--rounds", "1", "--fractions", "0.5", "1", "--threads", "1",
         "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "sampling.json").read_text())["results"]
    names = [r["scenario"] for r in rows]
    assert names[:2] == ["argmax", "none"]
    assert set(names[2:]) == {f"{f}@{x}" for f in ("bias", "grammar", "logprobs5", "penalties")
                              for x in ("0.5", "1")}
    none = next(r for r in rows if r["scenario"] == "none")
    assert none["over_none"] == 1.0
    for r in rows:
        assert r["step_ms"] > 0 and math.isfinite(r["over_argmax"])
        assert math.isclose(r["over_none"] * none["step_ms"], r["step_ms"], rel_tol=1e-9)
