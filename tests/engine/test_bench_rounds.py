"""`bench/trace.py`: `--rounds` runs both engines side by side, alternating rounds on the
trace with rotated prompts; `--fold on` serves the same greedy tokens as `--fold off`
(tiny random Llama on CPU, float32, a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rounds_alternate_keep_adapters_live_and_never_reuse_a_prefix(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "trace.py"), "--mode", "cuda", "--shape", "tiny",
         "--device", "cpu", "--dtype", "float32", "--adapters", "3", "--requests", "6",
         "--prompt-min", "20", "--prompt-max", "40", "--output-min", "3", "--output-max", "5",
         "--max-num-seqs", "4", "--max-batched-tokens", "64", "--kv-blocks", "64",
         "--skip-hf", "--rounds", "3", "--threads", "1", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rounds = [line for line in done.stderr.splitlines() if line.startswith("# round ")]
    assert [line.split(" (")[1].split(")")[0] for line in rounds] == [
        "engine+lora then engine-base", "engine-base then engine+lora",
        "engine+lora then engine-base"]
    results = json.loads((tmp_path / "trace_results.json").read_text())["results"]
    assert [(r["system"], r["round"], r["adapters"]) for r in results] == [
        (system, i, n) for i in range(3) for system, n in (("engine+lora", 3),
                                                            ("engine-base", 0))]
    # Same trace every round: the same output tokens, and every prompt token prefilled
    # again (a rotated prompt shares no full block with an earlier round's).
    assert len({r["output_tokens"] for r in results}) == 1
    assert len({r["steps"]["prefill_tokens"] for r in results}) == 1
    # In every round the LoRA arm's greedy tokens differ from the no-LoRA arm's: its
    # adapters stay live however many engines the process builds.
    for i in range(3):
        lora, base = (r["tokens_sha256"] for r in results[2 * i: 2 * i + 2])
        assert lora != base, f"round {i}: the LoRA arm generated the base model's tokens"
    ratios = [float(x) for x in done.stderr.split("ratio per round [")[1].split("]")[0].split(",")]
    tok_s = [r["output_tok_s"] for r in results]
    assert ratios == [round(tok_s[2 * i] / tok_s[2 * i + 1], 3) for i in range(3)]
    # Per plan class: every launched plan counted once, both arms schedule the same plans
    # (so their classes compare one to one), and spans are real times.
    for r in results:
        classes = r["plan_classes"]
        assert sum(int(c["plans"]) for c in classes.values()) == (
            r["steps"]["mixed_steps"] + r["steps"]["decode_steps"])
        assert all(c["s"] > 0 and c["rows"] >= 1 for c in classes.values())
        assert "decode" in classes and any(k.startswith("mixed<=") for k in classes)
    for i in range(3):
        lora, base = (r["plan_classes"] for r in results[2 * i: 2 * i + 2])
        assert {k: (c["plans"], c["rows"]) for k, c in lora.items()} == {
            k: (c["plans"], c["rows"]) for k, c in base.items()}
        assert lora["decode"]["slots"] > 0 and base["decode"]["slots"] == 0


def test_fold_trace_generates_the_launched_lora_tokens(tmp_path: Path) -> None:
    """`--fold on`: decode steps fold the LoRA into the base GEMMs from the pool's pages; the
    trace's greedy tokens are exactly those of `--fold off` (LoRA launched), and the LoRA
    arm's pool holds `--kv-blocks` KV pages beside its adapters' pages."""
    def run(fold: str) -> list[dict]:
        out = tmp_path / fold
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "trace.py"), "--mode", "cuda", "--shape",
             "tiny", "--device", "cpu", "--dtype", "float32", "--adapters", "3",
             "--requests", "6", "--prompt-min", "20", "--prompt-max", "40", "--output-min",
             "3", "--output-max", "5", "--max-num-seqs", "4", "--max-batched-tokens", "64",
             "--kv-blocks", "64", "--skip-hf", "--threads", "1", "--no-piecewise",
             "--fold", fold, "--out", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return list(json.loads((out / "trace_results.json").read_text())["results"])

    folded, launched = run("on"), run("off")
    assert [(r["system"], r["fold"]) for r in folded] == [("engine+lora", True),
                                                          ("engine-base", False)]
    assert [r["fold"] for r in launched] == [False, False]
    assert folded[0]["folded_steps"] > 0  # decode steps did fold
    assert [r["folded_steps"] for r in (*launched, folded[1])] == [0, 0, 0]
    assert folded[0]["tokens_sha256"] == launched[0]["tokens_sha256"]
    assert folded[0]["tokens_sha256"] != folded[1]["tokens_sha256"]  # the adapters matter
    assert folded[1]["tokens_sha256"] == launched[1]["tokens_sha256"]
    lora, base = folded
    assert lora["adapter_pages"] > 0 and lora["pool_pages"] == 64 + lora["adapter_pages"]
    assert (base["pool_pages"], base["adapter_pages"]) == (64, 0)
