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

    python3 bench/lora_kernels.py --tune --out $OUT   # sweep configs, then bench
    python3 bench/lora_kernels.py --out $OUT          # bench with the committed table
    python3 bench/lora_kernels.py --no-loop --only prefill,qkv --out $OUT  # a subset

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

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.kernels import LoraFactorTable, LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton import configs
from dataplane.kernels.triton.backend import TritonLoraBackend
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
    backend: TritonLoraBackend, rows: int, num_slots: int, method: str | None = None
) -> dict[str, float]:
    gen = torch.Generator().manual_seed(3)
    slots = torch.randint(-1, num_slots, (rows,), generator=gen, dtype=torch.int32).cuda()
    buffers = LoraMetaBuffers(rows, num_slots, "cuda")

    def build() -> None:
        build_meta_triton(slots, buffers, method)

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
    Scenario("decode", 256, 64, (64,), (4096, 1024, 1024)),
    Scenario("prefill", 4096, 32, (16,), (4096, 1024, 1024)),
    Scenario("decode", 256, 64, (8, 16, 32, 64)),
    Scenario("prefill", 4096, 32, (8, 16, 32, 64)),
]


def _install(table: dict, t_keys: tuple[int, ...]) -> Callable[[object], None]:
    """Installer of a shrink/expand candidate for every rank bucket of ``t_keys``."""

    def put(c: object) -> None:
        for tk in t_keys:
            for r_key in configs.R_BUCKETS:
                table[(tk, r_key)] = dataclasses.replace(c, block_r=min(64, r_key))  # type: ignore[type-var]

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
            total = sum(
                math.log(time_ours(sc, ring, backend, (metric,))[metric]) for sc, ring in built
            )
        except Exception as exc:  # a config that fails to compile/launch
            log(f"  {c} failed: {type(exc).__name__}: {exc}")
            continue
        log(f"  {c}: {metric} geomean {math.exp(total / len(built)):.2f} µs")
        if total < best_t:
            best, best_t = c, total
    if best is None:
        raise RuntimeError(f"no candidate ran: {cands}")
    install(best)
    return best, math.exp(best_t / len(built))


def tune(backend: TritonLoraBackend, log: Callable[[str], None]) -> dict[str, object]:
    """Sweep the knobs added since the committed table, keep the winners.

    Decode (T classes 64, 256; r in {16, 64}, n in {1, 16, 64}): the fused
    launch's config (the committed entry is the first candidate). Prefill
    (T = 4096, r = 64, n in {4, 32}): shrink row tile / warps, expand column
    tiles per program.
    Rank-bucket entries get the winner with ``block_r`` capped at the bucket.
    """
    SC, EC, FC = configs.ShrinkConfig, configs.ExpandConfig, configs.FusedConfig
    two = TritonLoraBackend(fused=False)
    chosen: dict[str, object] = {}
    for rows in (64, 256):
        t_key = configs.bucket(rows, configs.T_BUCKETS)
        scs = [Scenario("decode", rows, n, (r,)) for r in (16, 64) for n in (1, 16, 64)]
        built = [(sc, build_ring(sc, "scattered")) for sc in scs]
        cur = configs.FUSED_TABLE[t_key]
        fused_c = [cur] + [
            FC(16, bk, sk, w, st, per, ne)
            for bk, sk, w, st, per, ne in (
                (256, 16, 4, 3, 4, 8192), (128, 32, 4, 3, 4, 8192), (256, 16, 8, 3, 2, 16384),
            )
        ]  # fmt: skip
        keys = (16, 64) if t_key == 64 else (t_key,)

        def put_fused(c: object, keys: tuple[int, ...] = keys) -> None:
            for k in keys:
                configs.FUSED_TABLE[k] = c  # type: ignore[assignment]

        best, t = _sweep(put_fused, fused_c, built, backend, "ours", log)
        log(f"tuned fused T<={t_key}: {best} ({t:.2f} µs)")
        chosen[f"fused {t_key}"] = repr(best)
        del built
        torch.cuda.empty_cache()
    t_key = 4096
    built = [(sc, build_ring(sc, "scattered"))
             for sc in (Scenario("prefill", 4096, n, (64,)) for n in (4, 32))]  # fmt: skip
    shr_c = [SC(bm, 64, 128, 8, w, 3) for bm, w in ((32, 4), (64, 8), (128, 8))]
    exp_c = [EC(64, 128, 64, 4, 3, it) for it in (4, 8)]
    sweeps = (
        ("shrink", shr_c, configs.SHRINK_TABLE, "ours"),
        ("expand", exp_c, configs.EXPAND_TABLE, "expand"),
    )
    for op, cands, table, metric in sweeps:
        put = _install(table, (4096, 1 << 30))
        best, t = _sweep(put, cands, built, two, metric, log)
        log(f"tuned {op} T<={t_key}: {best} ({t:.2f} µs)")
        chosen[f"{op} {t_key}"] = repr(best)
    del built
    torch.cuda.empty_cache()
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="skip loop/base/extras")
    ap.add_argument("--no-loop", action="store_true", help="skip the (slow) loop baseline")
    ap.add_argument("--only", default="", help="comma list: scenarios whose name has one")
    args = ap.parse_args()
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
            results["tuned"] = tune(backend, log)
        except Exception as exc:  # keep benchmarking with what we have
            log(f"tuning failed: {type(exc).__name__}: {exc}")
        log(f"tuning took {time.time() - t0:.0f} s")
        log("SHRINK_TABLE = " + repr(configs.SHRINK_TABLE))
        log("EXPAND_TABLE = " + repr(configs.EXPAND_TABLE))
        log("FUSED_TABLE = " + repr(configs.FUSED_TABLE))
    meta_times = {} if args.only else {
        f"T={t} S={s} {m or 'auto'}": time_meta(backend, t, s, m)
        for t, s, m in (
            (64, 64, None), (64, 64, "sort"), (256, 64, None), (256, 64, "sort"),
            (256, 256, None), (256, 256, "sort"), (4096, 32, None), (4096, 32, "chunked"),
        )
    }  # fmt: skip
    results["meta"] = meta_times
    for k, v in meta_times.items():
        log(f"meta build {k}: graph {v['graph_us']:.2f} µs, eager host {v['eager_host_us']:.1f} µs")
    base = {t: time_base_gemm(t) for t in (64, 256, 4096)} if not (args.quick or args.only) else {}
    rows_out = []
    header = ("| r | scenario | floor | base GEMM | loop | ours (paged) | ours (stacked) | "
              "two-kernel | shrink | expand | best peer | ours/peer speedup | "
              "ours/floor |")  # fmt: skip
    log(header)
    log("|" + "---|" * 13)

    def display(sc: Scenario) -> str:
        return sc.name + ("" if sc.outs == (4096,) else " qkv 4096/1024/1024")

    only = [w for w in args.only.split(",") if w]
    for sc in [s for s in SCENARIOS + EXTRA if not only or any(w in display(s) for w in only)]:
        ring = build_ring(sc, "scattered")
        ours = time_ours(sc, ring, backend)
        two_k = ours["ours"]
        if configs.fused_config(sc.rows, sc.max_rank, sc.d_in) is not None:
            two_k = time_ours(sc, ring, two, ("ours",))["ours"]
        del ring
        stacked, loop = float("nan"), float("nan")
        both_layouts = sc.n == 64 or (sc.kind == "prefill" and sc.max_rank == 64)
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
        row = {
            "r": r, "scenario": name, "floor": floor, "base": base.get(sc.rows, float("nan")),
            "loop": loop, "ours": ours["ours"], "stacked": stacked, "shrink": ours["shrink"],
            "expand": ours["expand"], "two_kernel": two_k, "peer": peer, "ring": ring_size(sc),
            "floor_4073": sc.floor_bytes() / 4073 / 1e3,
        }  # fmt: skip
        rows_out.append(row)
        pc = f"{peer[0]:.1f} ({peer[1]})" if peer else "—"
        sp = f"{peer[0] / ours['ours']:.2f}×" if peer else "—"
        f4073 = ours["ours"] / (sc.floor_bytes() / 4073 / 1e3)
        log(f"| {r} | {name} | {floor:.1f} | {row['base']:.1f} | {loop:.1f} | "
            f"{ours['ours']:.1f} | {stacked:.1f} | {two_k:.1f} | {ours['shrink']:.1f} | "
            f"{ours['expand']:.1f} | {pc} | {sp} | {ours['ours'] / floor:.2f}× | "
            f"(vs 4073 GB/s floor {f4073:.2f}×)")  # fmt: skip
    results["rows"] = rows_out
    with open(os.path.join(args.out, "lora_bench.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
