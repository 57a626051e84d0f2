"""Serving one trace on one engine, timed (`run_engine`), and what `bench/trace.py` reports.

Per run: output tokens/s (total output tokens / makespan), TTFT p50/p99 (first token -
arrival), per-token latency p50/p99 ((last - first token) / (n - 1) per request), the
wall time split by step kind, the launched plans by class (`plan_classes`), the Triton
kernels compiled inside the timed window, and a digest of the greedy tokens.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.synthetic import Request, percentile, sync
from dataplane.core import BatchPlan, SamplingParams
from dataplane.engine import Engine, EngineObserver


@dataclass
class Timing:
    arrival: float
    tokens: list[float] = field(default_factory=list)


def summarize(name: str, timings: list[Timing], makespan: float, n_tokens: int) -> dict:
    ttft = [t.tokens[0] - t.arrival for t in timings]
    tpot = [(t.tokens[-1] - t.tokens[0]) / (len(t.tokens) - 1)
            for t in timings if len(t.tokens) > 1]
    return {"system": name, "output_tok_s": n_tokens / makespan, "makespan_s": makespan,
            "output_tokens": n_tokens,
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p99_ms": 1e3 * percentile(tpot, 99)}


def compiled_kernels() -> set[tuple[str, str]]:
    """(kernel, cache key) of every compiled Triton variant of a `dataplane` kernel so far
    (all devices); a difference of two calls names what compiled in between."""
    import triton

    seen: set[int] = set()
    found: set[tuple[str, str]] = set()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("dataplane.") or mod is None:
            continue
        for obj in vars(mod).values():
            if isinstance(obj, triton.runtime.jit.JITFunction) and id(obj) not in seen:
                seen.add(id(obj))
                for cache in obj.device_caches.values():
                    found.update((f"{name}.{obj.__name__}", str(key)) for key in cache[0])
    return found


def handle_of(handles: list[Any], r: Request) -> Any:
    return handles[r.adapter] if r.adapter is not None and handles else None


def warm_up(engine: Engine, trace: list[Request], handles: list[Any], device: str) -> None:
    """Untimed: every request of the trace with its prompt reversed (same lengths and
    adapters, no prefix-cache hit for the timed run) and 2 output tokens, all at once, so
    the kernel variants this trace's steps launch (prefill lengths, chunked and mixed
    steps) are compiled before the clock starts."""
    for i, r in enumerate(trace):
        engine.add_request(f"warm-up-{i}", r.prompt[::-1],
                           SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
                           handle_of(handles, r))
    while engine.has_unfinished():
        engine.step()
    sync(device)


@dataclass
class PlanMark:
    """A launched plan's shape and a clock reading taken in stream order just before its
    forward is enqueued (a CUDA event on CUDA, the host clock on CPU): plan k's span is
    mark k+1 - mark k, device idle time before the next plan included."""

    doff: int
    decodes: int
    slots: int  # distinct adapter slots among the plan's rows
    event: Any

    @staticmethod
    def at(plan: BatchPlan | None, device: str) -> PlanMark:
        if str(device).startswith("cuda"):
            event: Any = torch.cuda.Event(enable_timing=True)
            event.record()
        else:
            event = time.perf_counter()
        if plan is None:
            return PlanMark(0, 0, 0, event)
        return PlanMark(plan.doff, plan.num_decodes, len({s for s in plan.row_slot if s >= 0}),
                        event)

    def seconds_until(self, later: PlanMark) -> float:
        if isinstance(self.event, float):
            return float(later.event - self.event)
        return float(self.event.elapsed_time(later.event)) / 1e3


class PlanMarks(EngineObserver):
    """Marks every plan the engine launches (an engine observer)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.marks: list[PlanMark] = []

    def plan_launched(self, plan: BatchPlan, slot_ranks: dict[int, int]) -> None:
        self.marks.append(PlanMark.at(plan, self.device))


def plan_class(mark: PlanMark) -> str:
    """``decode`` for decode-only plans, else ``mixed<=T`` by the plan's row count on the
    LoRA kernels' T classes (1,024-2,048 split out: the 4,096 class's lower half)."""
    if mark.doff == 0:
        return "decode"
    rows = mark.doff + mark.decodes
    edge = next((e for e in (256, 1024, 2048, 4096) if rows <= e), None)
    return "mixed>4096" if edge is None else f"mixed<={edge}"


def plan_classes(marks: list[PlanMark], end: PlanMark) -> dict[str, dict[str, float]]:
    """Per plan class: plans, seconds (each plan's span in stream order, see `PlanMark`),
    mean rows and mean distinct adapter slots. Two arms run on the same trace schedule the
    same plans, so their classes compare one to one."""
    out: dict[str, dict[str, float]] = {}
    for mark, nxt in zip(marks, [*marks[1:], end], strict=True):
        c = out.setdefault(plan_class(mark), {"plans": 0, "s": 0.0, "rows": 0.0, "slots": 0.0})
        c["plans"] += 1
        c["s"] += mark.seconds_until(nxt)
        c["rows"] += mark.doff + mark.decodes
        c["slots"] += mark.slots
    for c in out.values():
        c["rows"] /= c["plans"]
        c["slots"] /= c["plans"]
    return dict(sorted(out.items()))


def step_breakdown(steps: list[tuple[float, bool]], marks: list[PlanMark]) -> dict:
    """Wall time of the timed run split by step kind: `engine.step()` calls that launched
    a plan with prefill rows ("mixed") and those that launched only decode rows."""
    out: dict[str, float] = {}
    for kind, want in (("mixed", True), ("decode", False)):
        times = [t for t, has_prefill in steps if has_prefill == want]
        out[f"{kind}_steps"] = len(times)
        out[f"{kind}_s"] = sum(times)
        out[f"{kind}_p50_ms"] = 1e3 * percentile(times, 50) if times else float("nan")
    out["prefill_tokens"] = sum(m.doff for m in marks)
    out["decode_rows_mean"] = sum(m.decodes for m in marks) / max(1, len(marks))
    return out


def run_engine(name: str, engine: Engine, trace: list[Request], handles: list[Any],
               device: str) -> dict:
    """Online driver: requests join at their arrival time; one engine.step() per loop.
    The engine is warmed up first (`warm_up`, untimed)."""
    warm_up(engine, trace, handles, device)
    compiled = compiled_kernels()
    observer = PlanMarks(device)
    engine.observers.append(observer)
    marks = observer.marks
    steps: list[tuple[float, bool]] = []  # (wall interval, whether a prefill was launched)
    timings: dict[str, Timing] = {}
    generated: dict[str, list[int]] = {}
    pending = list(enumerate(trace))
    n_tokens = 0
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0][1].arrival <= now:
            i, r = pending.pop(0)
            timings[f"{name}-{i}"] = Timing(start + r.arrival)
            engine.add_request(f"{name}-{i}", r.prompt,
                               SamplingParams(temperature=0.0, max_tokens=r.max_tokens,
                                              ignore_eos=True), handle_of(handles, r))
        if not engine.has_unfinished():
            time.sleep(max(0.0, pending[0][1].arrival - now))
            continue
        mark, before = len(marks), time.perf_counter()
        outs = engine.step()  # returns once its tokens are on the host; a device sync
        stamp = time.perf_counter()  # here would stall an async engine's next step
        steps.append((stamp - before, any(m.doff > 0 for m in marks[mark:])))
        for o in outs:
            timings[o.request_id].tokens.append(stamp)
            generated.setdefault(o.request_id, []).extend(o.new_token_ids)
            n_tokens += len(o.new_token_ids)
    sync(device)
    end = PlanMark.at(None, device)
    engine.observers.remove(observer)
    result = summarize(name, list(timings.values()), time.perf_counter() - start, n_tokens)
    result["plan_classes"] = plan_classes(marks, end)
    # Greedy: the same engine on the same trace gives the same tokens, run after run.
    in_order = [generated.get(f"{name}-{i}", []) for i in range(len(trace))]
    result["tokens_sha256"] = hashlib.sha256(json.dumps(in_order).encode()).hexdigest()
    new = sorted(compiled_kernels() - compiled)
    result["jit_compiles_timed"] = len(new)
    result["jit_compiled_while_timed"] = [f"{k}: {key[:300]}" for k, key in new]
    result["steps"] = step_breakdown(steps, marks)
    print(f"# {name}: {result['output_tok_s']:.1f} tok/s, {len(new)} Triton compiles while "
          f"timed {[k for k, _ in new]}; steps {result['steps']}", file=sys.stderr, flush=True)
    return result


def print_class_gaps(lora: dict[str, dict[str, float]], base: dict[str, dict[str, float]]) -> None:
    """Per plan class: the LoRA arm's seconds against the no-LoRA arm's, and the gap."""
    for name, c in lora.items():
        b = base.get(name, {"plans": 0, "s": 0.0})
        print(f"#   {name:>12}: {int(c['plans']):4d} plans ({int(b['plans'])}), rows "
              f"{c['rows']:7.1f}, slots {c['slots']:5.1f}: LoRA {c['s']:.3f} s vs "
              f"{b['s']:.3f} s, +{c['s'] - b['s']:.3f} s "
              f"(+{1e3 * (c['s'] - b['s']) / max(1, c['plans']):.2f} ms/plan)",
              file=sys.stderr, flush=True)


def markdown(results: list[dict]) -> str:
    lines = ["| system | adapters | output tok/s | TTFT p50 / p99 (ms) "
             "| per-token p50 / p99 (ms) |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['system']} | {r.get('adapters', '')} | {r['output_tok_s']:.1f} | "
                     f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | "
                     f"{r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} |")
    return "\n".join(lines)
