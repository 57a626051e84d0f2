"""`bench/tp.py` runs end to end on CPU (two gloo ranks, tiny shape) and its rows count
the collectives the issue-6 targets are about."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tp_bench_tiny_cpu_rows_and_collectives(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "tp.py"), "--shape", "tiny", "--device", "cpu",
           "--tp", "1", "2", "--adapters", "0", "6", "--steps", "2", "--batch", "4",
           "--prefill-requests", "2", "--prefill-len", "16", "--context", "16",
           "--mixed-prompts", "2", "--mixed-prompt-len", "8", "--kv-blocks", "64",
           "--profile", "1", "--fold", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "tp_bench.json").read_text())
    # TP=1: 0 and 6 adapters; TP=2: 0 adapters, 6 adapters in each layout and folded;
    # decode, prefill and mixed (4 decode rows + 2 prompts of 8 tokens)
    assert len(rows) == 18
    assert {r["rows_per_step"] for r in rows if r["phase"] == "mixed"} == {20}
    lora_calls = {(r["layout"], r["phase"]): r["collectives_per_step"]["lora"]["calls"]
                  for r in rows if r["tp"] == 2 and r["adapters"] and not r["fold"]}
    folded = [r for r in rows if r["fold"]]
    assert {r["phase"] for r in folded} == {"decode", "prefill", "mixed"}
    assert all(r["collectives_per_step"]["lora"]["calls"] == 0 for r in folded)
    # 4 rows use slots 0-3: the fold holds 4 of the 6, and the 2 idle ones were timed in
    (decode,) = [r for r in folded if r["phase"] == "decode"]
    assert (decode["fold_slots"], decode["fold_fill_adapters"]) == (4, 2)
    assert decode["fold_fill_ms"] > 0
    assert lora_calls[("no_extra_collectives", "decode")] == 0
    assert lora_calls[("no_extra_collectives", "prefill")] == 0
    assert lora_calls[("no_extra_collectives", "mixed")] == 0
    # paper schedule: one all-gather / all-reduce per LoRA projection, 4 per layer x 2
    assert lora_calls[("paper", "decode")] == 8
    base = [r["collectives_per_step"]["base"]["calls"] for r in rows if r["tp"] == 2]
    assert len(set(base)) == 1 and base[0] > 0  # LoRA never changes the base path's calls
    keeps = [json.loads(line) for line in done.stdout.splitlines() if '"keep"' in line]
    assert {(k["tp"], k["phase"], k["layout"], k["fold"]) for k in keeps} == {
        (tp, phase, layout, fold) for phase in ("decode", "mixed")
        for tp, layout, fold in ((1, "-", False), (2, "no_extra_collectives", False),
                                 (2, "paper", False), (2, "no_extra_collectives", True))}
