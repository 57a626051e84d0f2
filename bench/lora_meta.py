"""Timing of the LoRA metadata build (shared by all layers of a step) and the
``meta_kernel.py`` constants it suggests: every build method at T = 64 … 16384."""

from __future__ import annotations

import math
import time

import torch

from bench.lora_timing import graph_time_us
from dataplane.kernels import LoraMetaBuffers
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.kernels.triton.meta_kernel import build_meta_triton


def time_meta(
    backend: TritonLoraBackend,
    rows: int,
    num_slots: int,
    method: str | None = None,
    block: int | None = None,
) -> dict[str, float]:
    gen = torch.Generator().manual_seed(3)
    slots = torch.randint(-1, num_slots, (rows,), generator=gen, dtype=torch.int32).cuda()
    buffers = LoraMetaBuffers(rows, num_slots, "cuda")

    def build() -> None:
        build_meta_triton(slots, buffers, method, block)

    def build_32() -> None:  # amortise the graph launch over 32 builds
        for _ in range(32):
            build()

    gpu = graph_time_us(build_32, reps=20) / 32
    for _ in range(10):
        backend.build_meta(slots, buffers)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        build()
    host = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    return {"graph_us": gpu, "eager_host_us": host}


META_CASES: list[tuple[int, int, str | None, int | None]] = [
    (64, 64, None, None), (256, 64, None, None), (256, 256, None, None),  # auto = sort
    *[(t, 32, m, b) for t in (512, 1024) for m, b in
      (("sort", None), ("blocked", 256), ("blocked1", 256))],
    (4096, 32, None, None), (4096, 32, "sort", None),
    *[(4096, 32, m, b) for m in ("blocked", "blocked1") for b in (256, 512, 1024)],
    (16384, 256, None, None), (16384, 256, "blocked", 1024), (16384, 256, "blocked1", 512),
]  # fmt: skip


def meta_advice(times: dict[str, dict[str, float]]) -> str:
    """Paste-able ``meta_kernel.py`` constants from the metadata timings."""
    best: dict[int, tuple[float, str]] = {}
    sort_edge = 256
    for key, v in times.items():
        t = int(key.split()[0].removeprefix("T="))
        if t == 4096 and "blocked" in key and v["graph_us"] < best.get(t, (math.inf, ""))[0]:
            best[t] = (v["graph_us"], key)
    for t in (512, 1024):
        sort = times.get(f"T={t} S=32 sort", {}).get("graph_us", float("inf"))
        blk = min(
            times.get(f"T={t} S=32 {m} block=256", {}).get("graph_us", float("inf"))
            for m in ("blocked", "blocked1")
        )
        if sort <= blk:
            sort_edge = t
    lines = ["# ---- paste into dataplane/kernels/triton/meta_kernel.py ----",
             f"SORT_AUTO_MAX_ROWS = {sort_edge}"]  # fmt: skip
    if 4096 in best:
        us, key = best[4096]
        parts = key.split()
        lines.append(f'BLOCKED_METHOD = "{parts[2]}"  # T=4096 S=32: {us:.2f} µs')
        lines.append(f"BLOCKED_ROWS = {parts[3].removeprefix('block=')}")
    return "\n".join(lines)
