"""`bench/tp_engine.py` runs end to end on CPU (two gloo ranks, tiny shape; the TP ranks
build their engines from a model directory the bench writes): every TP and scheduling case
is timed, async TP steps hand the followers one token broadcast per overlapped step while
the synchronous loop sends none, and every rank's pool adds its adapters' pages to the KV
blocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tp_engine_bench_tiny_cpu(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "tp_engine.py"), "--shape", "tiny",
           "--device", "cpu", "--tp", "1", "2", "--adapters", "0", "2", "--batch", "4",
           "--context", "16", "--steps", "4", "--kv-blocks", "64",
           "--workdir", str(tmp_path / "work"), "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "work" / "base-tiny-bfloat16" / "model.safetensors").is_file()
    rows = json.loads((tmp_path / "tp_engine.json").read_text())
    assert {(r["tp"], r["adapters"], r["scheduling"]) for r in rows} == {
        (tp, n, mode) for tp in (1, 2) for n in (0, 2) for mode in ("sync", "async")}
    for r in rows:
        assert r["async_on"] == (r["scheduling"] == "async")
        assert (r["overlapped_steps"] > 0) == r["async_on"]
        if r["tp"] == 2:
            assert r["token_broadcasts"] == r["overlapped_steps"]
        else:
            assert "token_broadcasts" not in r
        assert r["step_ms_p50"] > 0
        # every rank's pool: the 64 KV blocks, plus the pages of its adapters (shards)
        assert (r["pool_pages"] > 64) == (r["adapters"] > 0)
        assert r["pool_pages"] >= 64


def test_tp_engine_bench_fold_tiny_cpu(tmp_path: Path) -> None:
    """`--fold` (TP=1): the adapter rows fold (the baseline row has no LoRA at all); their
    factors take pool pages beside the `--kv-blocks` KV blocks."""
    cmd = [sys.executable, str(ROOT / "bench" / "tp_engine.py"), "--shape", "tiny",
           "--device", "cpu", "--tp", "1", "--fold", "--adapters", "0", "2",
           "--batch", "4", "--context", "16", "--steps", "4", "--kv-blocks", "64",
           "--scheduling", "sync", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "tp_engine.json").read_text())
    assert [(r["adapters"], r["fold"]) for r in rows] == [(0, False), (2, True)]
    assert rows[0]["pool_pages"] == 64 < rows[1]["pool_pages"]
    assert all(r["step_ms_p50"] > 0 for r in rows)


def test_kv_capacity_bench_cpu(tmp_path: Path) -> None:
    """`bench/kv_capacity.py`: both page sources run the same checks; the pool's ratio to
    the free list is reported."""
    cmd = [sys.executable, str(ROOT / "bench" / "kv_capacity.py"), "--residents", "8",
           "--seqs", "8", "--rounds", "2", "--repeats", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "kv_capacity.json").read_text())
    assert [r["pages"] for r in rows] == ["unified pool", "free list"]
    assert all(r["checks"] == 24 and r["total_ms"] > 0 for r in rows)
    assert rows[0]["vs_free_list"] == rows[0]["total_ms"] / rows[1]["total_ms"]
