"""Benchmark of the LoRA branch kernels on one GPU (method of ../shared/BENCHMARKS.md).

One LoRA-wrapped linear layer, bf16, in = out = 4096 (plus fused q/k/v with GQA
widths and a mixed-rank batch). Decode: T rows, one per request, adapter =
row % n, rows shuffled. Prefill: n requests of T/n contiguous rows.

Timing: each case runs over a ring of L independent layers (own x, y and
factors) so that one sweep touches >= 256 MB and factors stream from HBM; the
sweep is captured in a CUDA graph and replayed; reported = median replay / L
(µs). Floor = (unique adapter bytes + x read + y read and write) / copy
bandwidth measured in the same run. The metadata build (shared by all layers
of a step) is timed separately. ``loop`` (per-adapter index_select + 2 mm +
index_add) and the base GEMM are timed in the same run.

    python3 bench/lora_kernels.py --tune --no-loop --no-stacked --out $OUT  # sweep, then bench
    python3 bench/lora_kernels.py --out $OUT          # bench with the committed table
    python3 bench/lora_kernels.py --no-loop --only prefill,qkv --out $OUT  # a subset

``--tune`` sweeps what is not settled (prefill expand per rank group incl. the
``y``-prefetch loop; the prefill shrink per rank group: row tile, ``BLOCK_K``,
stages, programs per SM = K splits, evict-first ``x``; the fused launch's
``min_split`` for q/k/v and gate/up with 64 live slots; ``--tune-decode`` adds
the decode fused sweep of the last run) and prints the winners as Python to
paste into ``configs.py``. The metadata section times every build method at
T = 64 … 16384 and prints the auto edge. Results are appended to
``lora_bench.json`` after every row (a cut-off run keeps what it measured).

"ours" is ``add_lora`` (one fused launch at decode sizes); decode rows also time
the two-kernel ``add_lora`` on the same ring for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.kernels import LoraFactorTable, LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton import configs
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.kernels.triton.fused_ops import fused_fits
from dataplane.kernels.triton.meta_kernel import build_meta_triton

DT = torch.bfloat16
RING_BYTES = 256 << 20
# BENCHMARKS.md, best peer per (r, scenario) (µs) and which.
PEER = {
    (16, "decode T=64 n=1"): (9.4, "vLLM"), (16, "decode T=64 n=16"): (16.1, "vLLM"),
    (16, "decode T=64 n=64"): (23.8, "SGLang csgmv"), (16, "decode T=256 n=1"): (16.3, "SGLang"),
    (16, "decode T=256 n=16"): (24.7, "vLLM"), (16, "decode T=256 n=64"): (26.1, "SGLang csgmv"),
    (16, "prefill T=4096 n=4"): (56.0, "vLLM"), (16, "prefill T=4096 n=32"): (70.9, "SGLang"),
    (64, "decode T=64 n=1"): (11.4, "vLLM"), (64, "decode T=64 n=16"): (27.2, "vLLM"),
    (64, "decode T=64 n=64"): (66.1, "SGLang csgmv"), (64, "decode T=256 n=1"): (20.3, "vLLM"),
    (64, "decode T=256 n=16"): (27.5, "vLLM"), (64, "decode T=256 n=64"): (61.5, "vLLM"),
    (64, "prefill T=4096 n=4"): (85.0, "vLLM"), (64, "prefill T=4096 n=32"): (168.7, "vLLM"),
}  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    kind: str  # "decode" | "prefill"
    rows: int
    n: int
    ranks: tuple[int, ...]  # slot s has ranks[s % len]
    outs: tuple[int, ...] = (4096,)
    d_in: int = 4096

    @property
    def name(self) -> str:
        return f"{self.kind} T={self.rows} n={self.n}"

    @property
    def max_rank(self) -> int:
        return max(self.ranks)

    def row_slot(self, gen: torch.Generator) -> list[int]:
        if self.kind == "decode":
            slots = [t % self.n for t in range(self.rows)]
            return [slots[i] for i in torch.randperm(self.rows, generator=gen).tolist()]
        per = self.rows // self.n
        return [t // per for t in range(self.rows)]

    def adapter_bytes(self) -> int:
        used = min(self.n, self.rows)
        return sum(
            self.ranks[s % len(self.ranks)] * (self.d_in + sum(self.outs)) * 2 for s in range(used)
        )

    def floor_bytes(self) -> int:
        return self.adapter_bytes() + self.rows * (self.d_in + 2 * sum(self.outs)) * 2


class Layer:
    """One layer of the ring: its own x, y and factor table (random factors
    written straight into the storage; ranks and scales set per slot)."""

    def __init__(self, sc: Scenario, layout: str) -> None:
        dev = "cuda"
        self.x = torch.randn(sc.rows, sc.d_in, device=dev, dtype=DT)
        self.y = torch.randn(sc.rows, sum(sc.outs), device=dev, dtype=DT)
        self.table = LoraFactorTable(sc.n, sc.d_in, sc.outs, sc.max_rank, DT, dev, layout)
        self.table.storage.normal_(0.0, 0.02)
        ranks = torch.tensor([sc.ranks[s % len(sc.ranks)] for s in range(sc.n)], dtype=torch.int32)
        self.table.ranks.copy_(ranks.expand(len(sc.outs), sc.n))
        self.table.scales.fill_(2.0)


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


def ring_size(sc: Scenario) -> int:
    return max(4, min(512, math.ceil(RING_BYTES / sc.floor_bytes())))


def build_ring(sc: Scenario, layout: str) -> list[Layer]:
    return [Layer(sc, layout) for _ in range(ring_size(sc))]


def time_ours(
    sc: Scenario,
    ring: list[Layer],
    backend: TritonLoraBackend,
    which: tuple[str, ...] = ("ours", "shrink", "expand"),
) -> dict[str, float]:
    """Per-layer µs of add_lora ("ours"), shrink alone and expand alone."""
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device="cuda")
    buffers = LoraMetaBuffers(sc.rows, sc.n, "cuda")
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


SCENARIOS = [
    Scenario(kind, rows, n, (r,))
    for r in (16, 64)
    for kind, rows, n in [
        ("decode", 64, 1), ("decode", 64, 16), ("decode", 64, 64),
        ("decode", 256, 1), ("decode", 256, 16), ("decode", 256, 64),
        ("prefill", 4096, 4), ("prefill", 4096, 32),
    ]
]  # fmt: skip
EXTRA = [
    Scenario("decode", 64, 16, (16,), (4096, 1024, 1024)),
    Scenario("decode", 64, 64, (16,), (4096, 1024, 1024)),  # engine q/k/v (Llama-8B)
    Scenario("decode", 64, 64, (16,), (14336, 14336)),  # engine gate/up
    Scenario("decode", 64, 64, (16,), (4096,), 14336),  # engine down
    Scenario("decode", 256, 64, (64,), (4096, 1024, 1024)),
    Scenario("prefill", 4096, 32, (16,), (4096, 1024, 1024)),
    Scenario("decode", 256, 64, (8, 16, 32, 64)),
    Scenario("prefill", 4096, 32, (8, 16, 32, 64)),
]


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


def _install_expand(t_keys: tuple[int, ...], r_keys: tuple[int, ...]) -> Callable[[object], None]:
    """Installer of an expand candidate for the given T classes and rank buckets."""

    def put(c: Any) -> None:
        for tk in t_keys:
            for r_key in r_keys:
                configs.EXPAND_TABLE[(tk, r_key)] = dataclasses.replace(c, block_r=min(64, r_key))

    return put


def _sweep(
    install: Callable[[object], None],
    cands: list,
    built: list,
    backend: TritonLoraBackend,
    metric: str,
    log: Callable[[str], None],
) -> tuple[object, float]:
    """Install each candidate, time ``metric`` (geomean over the built rings),
    leave the winner installed; returns (winner, geomean)."""
    best, best_t = None, float("inf")
    for c in cands:
        install(c)
        try:
            times = [time_ours(sc, ring, backend, (metric,))[metric] for sc, ring in built]
        except Exception as exc:  # a config that fails to compile/launch
            log(f"  {c} failed: {type(exc).__name__}: {exc}")
            continue
        total = sum(math.log(t) for t in times)
        each = ", ".join(f"{sc.name}{'' if sc.outs == (4096,) else ' ' + _outs(sc)} {t:.2f}"
                         for (sc, _), t in zip(built, times, strict=True))  # fmt: skip
        log(f"  {c}: {metric} geomean {math.exp(total / len(built)):.2f} µs ({each})")
        if total < best_t:
            best, best_t = c, total
    if best is None:
        raise RuntimeError(f"no candidate ran: {cands}")
    install(best)
    return best, math.exp(best_t / len(built))


def _outs(sc: Scenario) -> str:
    return f"{sc.d_in}->{'/'.join(map(str, sc.outs))}"


def _tune_decode_fused(backend: TritonLoraBackend, log: Callable[[str], None]) -> None:
    """The last run's decode sweep of the fused launch (committed entries won)."""
    for rows in (64, 256):
        t_key = configs.bucket(rows, configs.T_BUCKETS)
        scs = [Scenario("decode", rows, n, (r,)) for r in (16, 64) for n in (1, 16, 64)]
        built = [(sc, build_ring(sc, "scattered")) for sc in scs]
        cur = configs.FUSED_TABLE[t_key]
        cands = [cur] + [
            dataclasses.replace(cur, block_k=bk, split_k=sk, num_warps=w, per_sm=per, n_elems=ne)
            for bk, sk, w, per, ne in ((256, 16, 4, 4, 8192), (128, 32, 4, 4, 8192),
                                       (256, 16, 8, 2, 16384))
        ]  # fmt: skip
        keys = (16, 64) if t_key == 64 else (t_key,)

        def put(c: object, keys: tuple[int, ...] = keys) -> None:
            for k in keys:
                configs.FUSED_TABLE[k] = c  # type: ignore[assignment]

        best, t = _sweep(put, cands, built, backend, "ours", log)
        log(f"tuned fused T<={t_key}: {best} ({t:.2f} µs)")
        del built
        torch.cuda.empty_cache()


def _install_shrink(t_keys: tuple[int, ...], r_keys: tuple[int, ...]) -> Callable[[object], None]:
    """Installer of a shrink candidate for the given T classes and rank buckets."""

    def put(c: Any) -> None:
        for tk in t_keys:
            for r_key in r_keys:
                configs.SHRINK_TABLE[(tk, r_key)] = dataclasses.replace(c, block_r=min(64, r_key))

    return put


SHRINK_SWEEP_BUDGET_S = 65.0  # keeps `--tune --no-loop --no-stacked` under 3 minutes
SHRINK_R16_FINALISTS = 4  # r = 16 times the best r = 64 candidates (and the committed one)


def _tune_prefill_shrink(
    two: TritonLoraBackend, log: Callable[[str], None], budget_s: float = SHRINK_SWEEP_BUDGET_S
) -> dict[str, object]:
    """Prefill shrink sweep, T = 4096, n in {4, 32}: r = 64 over every
    ``configs.PREFILL_SHRINK_CANDIDATES`` entry, then r = 16 over the committed
    entry and the ``SHRINK_R16_FINALISTS`` best of r = 64 (each variant compiles
    once per (n, rank) shape; the r = 16 rerun halves the sweep's compile time).

    Metric: the whole two-kernel ``add_lora`` (geomean over n): the K splits
    the shrink writes are summed by the expand, so a shrink that wins alone by
    splitting more can lose overall. The shrink alone is logged too. Stops
    starting new candidates after ``budget_s`` (the committed entry is always
    timed first). Winners stay installed and go to ``configs.SHRINK_BY_RANK``.
    """
    t0 = time.time()
    chosen: dict[str, object] = {}
    committed = configs.PREFILL_SHRINK_CANDIDATES[0]
    ranked: list[tuple[float, object]] = []
    for group, r_keys in ((64, (64, 128, 256)), (16, (16, 32))):
        if group == 64:
            cands: list[object] = list(configs.PREFILL_SHRINK_CANDIDATES)
        else:
            best64 = [c for _, c in sorted(ranked, key=lambda p: p[0])]
            cands = [committed, *[c for c in best64 if c != committed][:SHRINK_R16_FINALISTS]]
        built = [(sc, build_ring(sc, "scattered"))
                 for sc in (Scenario("prefill", 4096, n, (group,)) for n in (4, 32))]  # fmt: skip
        put = _install_shrink((4096, 1 << 30), r_keys)
        best, best_t = None, math.inf
        for c in cands:
            if best is not None and time.time() - t0 > budget_s:
                log(f"  shrink sweep budget {budget_s:.0f} s spent: {c} and later not timed")
                break
            put(c)
            try:
                times = [time_ours(sc, ring, two, ("ours", "shrink")) for sc, ring in built]
            except Exception as exc:  # a config that fails to compile/launch
                log(f"  {c} failed: {type(exc).__name__}: {exc}")
                continue
            geo = math.exp(sum(math.log(t["ours"]) for t in times) / len(times))
            each = ", ".join(f"n={sc.n} add_lora {t['ours']:.2f} shrink {t['shrink']:.2f}"
                             for (sc, _), t in zip(built, times, strict=True))  # fmt: skip
            log(f"  r={group} {c}: add_lora geomean {geo:.2f} µs ({each})")
            if group == 64:
                ranked.append((geo, c))
            if geo < best_t:
                best, best_t = c, geo
        if best is None:
            raise RuntimeError(f"no prefill shrink candidate ran for r={group}")
        put(best)
        configs.SHRINK_BY_RANK[(4096, group)] = best  # type: ignore[assignment]
        log(f"tuned prefill shrink r-group {group}: {best} ({best_t:.2f} µs add_lora geomean)")
        chosen[f"shrink 4096 r{group}"] = repr(best)
        del built
        torch.cuda.empty_cache()
    log(f"prefill shrink sweep took {time.time() - t0:.0f} s")
    return chosen


def tune(backend: TritonLoraBackend, log: Callable[[str], None], decode: bool) -> dict[str, object]:
    """Sweep the open choices, keep the winners installed, print them as Python.

    1. Prefill expand (T = 4096, n in {4, 32}), rank groups 16 and 64 apart:
       ``Bt``- vs ``y``-prefetching column loop, row tile, column tile, tiles
       per program (metric: the expand alone, two-kernel path).
    2. Fused launch ``min_split`` (1 = old rule: such steps run two kernels;
       2, 4) on the engine's many-slot multi-slice decode steps: q/k/v at T=64
       r=16 and T=256 r=64, gate/up at T=64 r=16, 64 slots (metric: add_lora).
    3. Prefill shrink (``_tune_prefill_shrink``): row tile, ``BLOCK_K``,
       stages, programs per SM (hence K splits), evict-first ``x``; r = 16
       and r = 64 apart, with the expand winners of 1 installed.
    4. With ``decode``: the decode fused sweep of the last run.
    """
    ec = configs.ExpandConfig
    two = TritonLoraBackend(fused=False)
    chosen: dict[str, object] = {}
    exp_c = [
        ec(64, 128, 64, 4, 3, 4),  # committed for r = 64 (34.5 µs at n = 4)
        ec(64, 128, 64, 4, 3, 4, y_prefetch=True),  # committed for r <= 32
        ec(64, 64, 64, 4, 3, 8, y_prefetch=True),  # half the live y/acc registers
        ec(32, 128, 64, 4, 3, 4, y_prefetch=True),
        ec(64, 64, 64, 4, 3, 8),
        ec(32, 128, 64, 4, 3, 8),
        ec(64, 128, 64, 8, 3, 4, y_prefetch=True),  # 8 warps: half the registers per thread
        ec(64, 128, 64, 4, 3, 2, y_prefetch=True),  # twice the programs
    ]
    for group, r_keys in ((16, (16, 32)), (64, (64, 128, 256))):
        built = [(sc, build_ring(sc, "scattered"))
                 for sc in (Scenario("prefill", 4096, n, (group,)) for n in (4, 32))]  # fmt: skip
        put = _install_expand((4096, 1 << 30), r_keys)
        best, t = _sweep(put, exp_c, built, two, "expand", log)
        configs.EXPAND_BY_RANK[(4096, group)] = best  # type: ignore[assignment]
        log(f"tuned prefill expand r-group {group}: {best} ({t:.2f} µs)")
        chosen[f"expand 4096 r{group}"] = repr(best)
        del built
        torch.cuda.empty_cache()
    chosen.update(_tune_prefill_shrink(two, log))
    for rows, rank in ((64, 16), (256, 64)):
        t_key = configs.bucket(rows, configs.T_BUCKETS)
        scs = [Scenario("decode", rows, 64, (rank,), (4096, 1024, 1024))]
        if rows == 64:
            scs.append(Scenario("decode", rows, 64, (rank,), (14336, 14336)))
        built = [(sc, build_ring(sc, "scattered")) for sc in scs]
        cur = configs.FUSED_TABLE[t_key]
        cands = [dataclasses.replace(cur, min_split=m) for m in (2, 4, 1)]
        keys = (16, 64) if t_key == 64 else (t_key,)

        def put_fused(c: object, keys: tuple[int, ...] = keys) -> None:
            for k in keys:
                configs.FUSED_TABLE[k] = c  # type: ignore[assignment]

        best, t = _sweep(put_fused, cands, built, backend, "ours", log)
        log(f"tuned fused min_split T<={t_key}: {best} ({t:.2f} µs; min_split 1 = two kernels)")
        chosen[f"fused {t_key}"] = repr(best)
        del built
        torch.cuda.empty_cache()
    if decode:
        _tune_decode_fused(backend, log)
    return chosen


def paste_block() -> str:
    """The tuned tables as Python for ``configs.py``."""
    by_rank = ",\n".join(f"    {k}: {v!r}" for k, v in sorted(configs.EXPAND_BY_RANK.items()))
    shrink = ",\n".join(f"    {k}: {v!r}" for k, v in sorted(configs.SHRINK_BY_RANK.items()))
    fused = ",\n".join(f"    {k}: {v!r}" for k, v in sorted(configs.FUSED_TABLE.items()))
    return (
        "# ---- paste into dataplane/kernels/triton/configs.py ----\n"
        f"EXPAND_BY_RANK: dict[tuple[int, int], ExpandConfig] = {{\n{by_rank},\n}}\n"
        f"SHRINK_BY_RANK: dict[tuple[int, int], ShrinkConfig] = {{\n{shrink},\n}}\n"
        f"FUSED_TABLE: dict[int, FusedConfig] = {{\n{fused},\n}}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="skip loop/base/extras")
    ap.add_argument("--no-loop", action="store_true", help="skip the (slow) loop baseline")
    ap.add_argument("--only", default="", help="comma list: scenarios whose name has one")
    ap.add_argument("--no-stacked", action="store_true", help="skip the stacked-layout rings")
    ap.add_argument("--tune-decode", action="store_true", help="also re-sweep decode fused")
    args = ap.parse_args()
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "lora_bench.log"), "a")  # noqa: SIM115

    def log(msg: str) -> None:
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    backend = TritonLoraBackend(fused=True)
    two = TritonLoraBackend(fused=False)
    log(f"device {torch.cuda.get_device_name()} torch {torch.__version__}")
    bws = copy_bandwidth()
    bw = max(bws.values())
    log(f"copy bandwidth {bws} -> floor uses {bw:.0f} GB/s")
    results: dict[str, object] = {"copy_GBps": bw, "copy_GBps_ways": bws}
    if args.tune:
        t0 = time.time()
        try:
            results["tuned"] = tune(backend, log, args.tune_decode)
        except Exception as exc:  # keep benchmarking with what we have
            log(f"tuning failed: {type(exc).__name__}: {exc}")
        log(f"tuning took {time.time() - t0:.0f} s")
        log(paste_block())
    dump = os.path.join(args.out, "lora_bench.json")

    def save() -> None:
        with open(dump, "w") as f:
            json.dump(results, f, indent=1, default=str)

    save()
    t_meta = time.time()
    meta_times = {} if args.only else {
        f"T={t} S={s} {m or 'auto'}{'' if b is None else f' block={b}'}": time_meta(
            backend, t, s, m, b
        )
        for t, s, m, b in META_CASES
    }  # fmt: skip
    log(f"metadata timing took {time.time() - t_meta:.0f} s")
    results["meta"] = meta_times
    for k, v in meta_times.items():
        log(f"meta build {k}: graph {v['graph_us']:.2f} µs, eager host {v['eager_host_us']:.1f} µs")
    if meta_times:
        log(meta_advice(meta_times))
    save()
    base = {t: time_base_gemm(t) for t in (64, 256, 4096)} if not (args.quick or args.only) else {}
    rows_out: list[dict[str, Any]] = []
    header = ("| r | scenario | floor | base GEMM | loop | ours (paged) | ours (stacked) | "
              "two-kernel | shrink | expand | best peer | ours/peer speedup | "
              "ours/floor |")  # fmt: skip
    log(header)
    log("|" + "---|" * 13)
    results["rows"] = rows_out

    def display(sc: Scenario) -> str:
        if sc.outs == (4096,) and sc.d_in == 4096:
            return sc.name
        kind = {3: "qkv", 2: "gate/up"}.get(len(sc.outs), "down")
        return f"{sc.name} {kind} {_outs(sc)}"

    def path(sc: Scenario) -> str:
        """Which launch ``add_lora`` takes for this step (all slots live)."""
        cfg = configs.fused_config(sc.rows, sc.max_rank, sc.d_in)
        if cfg is None:
            return "two kernels"
        fits = fused_fits(sc.rows, sc.n, len(sc.outs), sc.max_rank, cfg,
                          backend.workspace_numel(sc.rows, len(sc.outs), sc.max_rank),
                          LoraWorkspace.COUNTERS, torch.device("cuda"))  # fmt: skip
        return "fused" if fits else "two kernels (fused_fits)"

    only = [w for w in args.only.split(",") if w]
    for sc in [s for s in SCENARIOS + EXTRA if not only or any(w in display(s) for w in only)]:
        ring = build_ring(sc, "scattered")
        ours = time_ours(sc, ring, backend)
        two_k = ours["ours"]
        if configs.fused_config(sc.rows, sc.max_rank, sc.d_in) is not None:
            two_k = time_ours(sc, ring, two, ("ours",))["ours"]
        del ring
        stacked, loop = float("nan"), float("nan")
        both_layouts = not args.no_stacked and (
            sc.n == 64 or (sc.kind == "prefill" and sc.max_rank == 64)
        )
        if both_layouts or (not args.quick and not args.no_loop and sc in SCENARIOS):
            ring = build_ring(sc, "stacked")
            if both_layouts:
                stacked = time_ours(sc, ring, backend, ("ours",))["ours"]
            if not args.quick and not args.no_loop and sc in SCENARIOS:
                loop = time_loop(sc, ring)
            del ring
        torch.cuda.empty_cache()
        floor = sc.floor_bytes() / bw / 1e3
        r = sc.max_rank if len(sc.ranks) == 1 else "8–64"
        name = display(sc)
        plain = len(sc.ranks) == 1 and sc.outs == (4096,)
        peer = PEER.get((sc.max_rank, sc.name)) if plain else None
        row: dict[str, Any] = {
            "r": r, "scenario": name, "floor": floor, "base": base.get(sc.rows, float("nan")),
            "loop": loop, "ours": ours["ours"], "stacked": stacked, "shrink": ours["shrink"],
            "expand": ours["expand"], "two_kernel": two_k, "peer": peer, "ring": ring_size(sc),
            "floor_4073": sc.floor_bytes() / 4073 / 1e3, "path": path(sc),
        }  # fmt: skip
        rows_out.append(row)
        save()
        pc = f"{peer[0]:.1f} ({peer[1]})" if peer else "—"
        sp = f"{peer[0] / ours['ours']:.2f}×" if peer else "—"
        f4073 = ours["ours"] / (sc.floor_bytes() / 4073 / 1e3)
        log(f"| {r} | {name} | {floor:.1f} | {row['base']:.1f} | {loop:.1f} | "
            f"{ours['ours']:.1f} | {stacked:.1f} | {two_k:.1f} | {ours['shrink']:.1f} | "
            f"{ours['expand']:.1f} | {pc} | {sp} | {ours['ours'] / floor:.2f}× | "
            f"(vs 4073 GB/s floor {f4073:.2f}×; {row['path']})")  # fmt: skip
    log(f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
