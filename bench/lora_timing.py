"""CUDA-graph timing of the LoRA kernels, the loop baseline, the base GEMM and copies.

Every time is the median replay of a captured CUDA graph, in µs; ring times are per layer.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import torch

from bench.lora_cases import DT, RING_BYTES, Layer, Scenario
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton.backend import TritonLoraBackend


def graph_time_us(fn: Callable[[], None], reps: int = 15) -> float:
    """Median replay time (µs) of ``fn`` captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    del g
    return statistics.median(times)


def copy_bandwidth() -> dict[str, float]:
    """Device copy GB/s (bytes read + written), median of graph replays, two ways:
    ``copy_`` (captured as memcpy nodes, which measured ~2.7 TB/s here) and an
    elementwise SM kernel (``torch.mul``). The floor uses the larger."""
    n = 1 << 28  # 1 GiB of float32
    a = torch.randn(n, device="cuda")
    b = torch.empty_like(a)
    for _ in range(50):  # let the clocks ramp up
        b.copy_(a)

    def memcpy() -> None:
        for _ in range(10):
            b.copy_(a)

    def sm_copy() -> None:
        for _ in range(10):
            torch.mul(a, 1.0, out=b)

    out = {}
    for name, fn in (("memcpy_node", memcpy), ("sm_kernel", sm_copy)):
        us = graph_time_us(fn, reps=10) / 10
        out[name] = 2 * 4 * n / us / 1e3
    return out


def time_ours(
    sc: Scenario,
    ring: list[Layer],
    backend: TritonLoraBackend,
    which: tuple[str, ...] = ("ours", "shrink", "expand"),
) -> dict[str, float]:
    """Per-layer µs of add_lora ("ours"), shrink alone and expand alone."""
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device="cuda")
    buffers = LoraMetaBuffers(sc.rows, sc.slots, "cuda")
    meta = backend.build_meta(slots, buffers)
    ws = LoraWorkspace(backend.workspace_numel(sc.rows, len(sc.outs), sc.max_rank), "cuda")
    z = backend.shrink(ring[0].x, meta, ring[0].table.weights, ws)

    def full() -> None:
        for layer in ring:
            backend.add_lora(layer.y, layer.x, meta, layer.table.weights, ws)

    def shrink_only() -> None:
        for layer in ring:
            backend.shrink(layer.x, meta, layer.table.weights, ws)

    def expand_only() -> None:
        for layer in ring:
            backend.expand(layer.y, z, meta, layer.table.weights)

    fns = {"ours": full, "shrink": shrink_only, "expand": expand_only}
    return {k: graph_time_us(fns[k]) / len(ring) for k in which}


def time_loop(sc: Scenario, ring: list[Layer]) -> float:
    gen = torch.Generator().manual_seed(1)
    slot_list = sc.row_slot(gen)
    groups = []
    for s in range(sc.n):
        rows = [t for t, x in enumerate(slot_list) if x == s]
        if rows:
            groups.append((s, torch.tensor(rows, device="cuda")))
    offs = [sum(sc.outs[:k]) for k in range(len(sc.outs))]
    use = ring[: max(4, min(len(ring), 16))]

    def loop() -> None:
        for layer in use:
            w = layer.table.weights
            assert w.stacked is not None
            for s, idx in groups:
                xs = layer.x.index_select(0, idx)
                for k, (a, bt) in enumerate(w.stacked):
                    r = sc.ranks[s % len(sc.ranks)]
                    d = (xs @ a[s, :r].t()) @ bt[s, :r] * 2.0
                    layer.y[:, offs[k] : offs[k] + sc.outs[k]].index_add_(0, idx, d)

    return graph_time_us(loop, reps=7) / len(use)


def time_base_gemm(rows: int, d_in: int = 4096, d_out: int = 4096) -> float:
    n = max(8, math.ceil(RING_BYTES / (d_in * d_out * 2)))
    ws = [torch.randn(d_out, d_in, device="cuda", dtype=DT) for _ in range(n)]
    xs = [torch.randn(rows, d_in, device="cuda", dtype=DT) for _ in range(n)]
    ys = [torch.empty(rows, d_out, device="cuda", dtype=DT) for _ in range(n)]

    def run() -> None:
        for w, x, y in zip(ws, xs, ys, strict=True):
            torch.mm(x, w.t(), out=y)

    return graph_time_us(run) / n


def module_table(cols: tuple[str, ...], cases: Mapping[str, Any],
                 measure: Callable[[str, Any], dict[str, float]], path: str) -> None:
    """Measure every case, printing one markdown row per module as it comes (µs, ``—``
    for a column the case does not have); all results to ``path`` as JSON."""
    print("| module (T=128, r=16, 50 slots) | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    results = {}
    for name, case in cases.items():
        t = measure(name, case)
        results[name] = t
        print(f"| {name} | " + " | ".join(f"{t[c]:.1f}" if c in t else "—" for c in cols)
              + " |", flush=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def probe_parser(doc: str | None) -> argparse.ArgumentParser:
    """The device probes' command line: ``--out DIR`` for results, ``--smoke`` for the CPU
    check under ``TRITON_INTERPRET=1`` (``tests/kernels/test_bench_smoke.py``)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true", help="CPU check only (interpreter)")
    return ap
