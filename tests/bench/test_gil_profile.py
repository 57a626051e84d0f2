"""bench/gil_profile.py: thread shares and inclusive function shares of a raw py-spy
profile (each stack's count once per function, recursion included once)."""

from __future__ import annotations

from pathlib import Path

from bench.gil_profile import summarize


def test_shares_of_a_raw_profile(tmp_path: Path) -> None:
    raw = tmp_path / "agent-gil.prof"
    raw.write_text("\n".join([
        "thread (101): engine-loop;EngineLoop._run (agent/serving.py:192);"
        "StepLoop.step (dataplane/engine/step_loop.py:111) 6",
        "thread (101): engine-loop;EngineLoop._run (agent/serving.py:192);"
        "Scheduler.apply_tokens (dataplane/engine/scheduler.py:504);"
        "Scheduler.apply_tokens (dataplane/engine/scheduler.py:520) 2",
        "thread (7): MainThread;BaseEventLoop._run_once (asyncio/base_events.py:1)"
        ";Mailbox._drain (agent/mailbox.py:44) 2",
        "",
        "garbage line without a count",
    ]) + "\n")
    doc = summarize(raw, top=3)
    assert doc["samples"] == 10
    assert doc["threads"] == {"engine-loop": 0.8, "MainThread": 0.2}
    assert doc["functions"] == {"EngineLoop._run": 0.8, "StepLoop.step": 0.6,
                                "Scheduler.apply_tokens": 0.2}
    empty = tmp_path / "empty.prof"
    empty.write_text("")
    assert summarize(empty) == {"samples": 0, "threads": {}, "functions": {}}
