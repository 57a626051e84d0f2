"""`bench/tp.py` runs end to end on CPU (TP=1 in process, TP=2 as two gloo ranks built from
the model directory the bench writes; tiny shape): every case has its rows, the LoRA adds
no collective call and the base path issues 2 x layers + 2 per step, folded or not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = 2  # bench.synthetic.TINY_SHAPE
PHASES = ("decode", "prefill", "mixed")


def test_tp_bench_tiny_cpu_rows_and_collectives(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "tp.py"), "--shape", "tiny", "--device", "cpu",
           "--tp", "1", "2", "--adapters", "0", "6", "--steps", "2", "--batch", "4",
           "--prefill-requests", "2", "--prefill-len", "16", "--context", "16",
           "--mixed-prompts", "2", "--mixed-prompt-len", "8", "--kv-blocks", "64",
           "--profile", "1", "--fold", "--graphs", "both", "--piecewise",
           "--workdir", str(tmp_path / "work"), "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "work" / "base-tiny-bfloat16" / "model.safetensors").is_file()
    saved = json.loads((tmp_path / "tp_bench.json").read_text())
    assert saved["args"]["graphs"] == "both"
    rows = saved["results"]
    assert len((tmp_path / "tp_rows.jsonl").read_text().splitlines()) == len(rows)
    timed = [r for r in rows if "tokens_per_s" in r]
    # per TP degree: no LoRA, 6 adapters, 6 adapters folded; each phase once, eagerly
    cases = {(tp, n, fold) for tp in (1, 2) for n, fold in ((0, False), (6, False), (6, True))}
    assert sorted((r["tp"], r["adapters"], r["fold"], r["phase"]) for r in timed) == sorted(
        (*case, phase) for case in cases for phase in PHASES)
    assert all(r["mode"] == "eager" and r["tokens_per_s"] > 0 for r in timed)
    # CPU: the decode-graph and piecewise rows of every case say why they did not run
    untimed = [r for r in rows if "tokens_per_s" not in r]
    assert sorted((r["tp"], r["adapters"], r["fold"], r["phase"], r["mode"]) for r in untimed) \
        == sorted((*case, phase, "graphs" if phase == "decode" else "piecewise")
                  for case in cases for phase in PHASES)
    assert all("CUDA" in r["graphs_error"] for r in untimed)
    assert {r["rows_per_step"] for r in timed if r["phase"] == "mixed"} == {4 + 2 * 8}
    assert {r["distinct_adapters"] for r in timed if r["adapters"]} == {2, 4, 6}
    for r in timed:
        if r["tp"] == 1:
            assert r["collectives_per_step"] is None
            continue
        ledger = r["collectives_per_step"]
        assert ledger["lora"] == {"calls": 0, "payload_bytes": 0, "ring_bytes": 0.0}
        assert ledger["base"]["calls"] == 2 * LAYERS + 2
    # 4 decode rows use adapters 0-3: the fold holds 4 of the 6, the 2 idle ones timed in
    folded = [r for r in timed if r["fold"] and r["phase"] == "decode"]
    assert len(folded) == 2
    for r in folded:
        assert (r["fold_slots"], r["fold_fill_adapters"]) == (4, 2)
        assert r["fold_fill_ms"] > 0
    keeps = [json.loads(line) for line in done.stdout.splitlines() if '"keep"' in line]
    assert sorted((k["tp"], k["phase"], k["mode"], k["fold"]) for k in keeps) == sorted(
        (tp, phase, "eager", fold) for tp in (1, 2) for phase in ("decode", "mixed")
        for fold in (False, True))
