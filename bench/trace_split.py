"""`bench/trace.py --split-eager`: host enqueue time against device time of each step (CUDA).

On a replay of the trace on the warm engine (every request at once, prompts rotated by 3
tokens: no prefix hit on the timed run's blocks), each `runner.execute` call is preceded
by a ~0.15 s device spin, so the host queues the whole step while the device waits, and
events around the call time its kernels back to back. A step is host-bound when its host
time exceeds its device time. Also the rest of each `engine.step()` outside `execute`
(scheduling, plan, sampling, outputs: host work plus the sampled tokens' copy). Steps
with prefill rows or an eager forward ("eager": mixed steps, also when replayed as
piecewise graphs) are summed per row class, decode graph replays apart.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.synthetic import Request
from bench.trace_run import handle_of
from dataplane.core import BatchPlan, SamplingParams
from dataplane.engine import Engine


def replay(engine: Engine, trace: list[Request], handles: list[Any], tag: str,
           rotate: int) -> int:
    """Serve the whole trace again, every request at once, each prompt rotated by `rotate`
    tokens. Returns the steps."""
    for i, r in enumerate(trace):
        engine.add_request(f"{tag}-{i}", r.prompt[rotate:] + r.prompt[:rotate],
                           SamplingParams(temperature=0.0, ignore_eos=True,
                                          max_tokens=r.max_tokens), handle_of(handles, r))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps


def split_eager(engine: Engine, trace: list[Request], handles: list[Any], path: Path) -> None:
    """See the module docstring; lines to stderr, per-step rows to `path`."""
    runner = engine.runner
    forward, execute, step = runner.model.forward, runner.execute, engine.step
    rows: list[list[Any]] = []  # (eager, rows, execute host s, device s, rest of step s)
    eager = [False]

    def flagged(*a: Any, **k: Any) -> Any:
        eager[0] = True
        return forward(*a, **k)

    def timed(plan: BatchPlan, *a: Any, **k: Any) -> torch.Tensor:
        eager[0] = False
        torch.cuda._sleep(300_000_000)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        t0 = time.perf_counter()
        out = execute(plan, *a, **k)
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        rows.append([eager[0] or plan.doff > 0, plan.num_rows, host,
                     begin.elapsed_time(end) / 1e3, -(time.perf_counter() - t0)])
        return out

    def stepped() -> Any:
        mark, t0 = len(rows), time.perf_counter()
        out = step()
        for r in rows[mark:]:
            r[4] += time.perf_counter() - t0
        return out

    setattr(runner.model, "forward", flagged)  # noqa: B010 (bench-only instrumentation)
    setattr(runner, "execute", timed)  # noqa: B010
    setattr(engine, "step", stepped)  # noqa: B010
    try:
        replay(engine, trace, handles, "split", 3)
    finally:
        del runner.model.forward, runner.execute, engine.step
    lines = []
    classes = [("graph", 0, 1 << 30, False), ("eager T<=256", 0, 256, True),
               ("eager T<=1024", 256, 1024, True), ("eager T>1024", 1024, 1 << 30, True)]
    for label, lo, hi, kind in classes:
        sel = [r for r in rows if r[0] == kind and lo < r[1] <= hi]
        if sel:
            k = len(sel)
            lines.append(
                f"{label}: {k} steps, mean rows {sum(r[1] for r in sel) / k:.0f}, "
                f"execute host {1e3 * sum(r[2] for r in sel) / k:.2f} ms/step, device "
                f"{1e3 * sum(r[3] for r in sel) / k:.2f} ms/step, rest of step "
                f"{1e3 * sum(r[4] for r in sel) / k:.2f} ms/step, host-bound steps "
                f"{sum(1 for r in sel if r[2] > r[3])}")
    print("# split " + "\n# split ".join(lines), file=sys.stderr, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n" + "\n".join(
        f"{'E' if e else 'G'} rows={n} host_ms={1e3 * h:.2f} device_ms={1e3 * d:.2f} "
        f"rest_ms={1e3 * o:.2f}" for e, n, h, d, o in rows) + "\n")
