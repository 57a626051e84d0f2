"""Benchmark of the LoRA branch kernels on one GPU (method: docs/PERFORMANCE.md, "LoRA kernels").

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
stages, programs per SM = K splits, evict-first ``x``; the fused launch's grid
(programs per SM, minimum split, expand pipelining) per module shape class;
``--tune-sweeps`` picks among them) and writes the fused, shrink and expand tables it
ends with to ``tuned_configs.json``, which ``ADAPTERPLANE_LORA_TUNED=<file>`` installs in
any process (engine, agent, bench); its sections have the layout of
``dataplane/kernels/triton/tuned/h200.json``, the shipped tables.
The metadata section times every build method at T = 64 … 16384 and prints the
auto edge. Results are appended to
``lora_bench.json`` after every row (a cut-off run keeps what it measured).

"ours" is ``add_lora`` (one fused launch at decode sizes); decode rows also time
the two-kernel ``add_lora`` on the same ring for comparison.

This file is the CLI; the parts live beside it: ``lora_cases.py`` (scenarios, peers,
the layer ring), ``lora_timing.py`` (CUDA-graph timing), ``lora_meta.py`` (metadata
build timing) and ``lora_tune.py`` (the ``--tune`` sweeps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_cases import EXTRA, PEER, SCENARIOS, Scenario, build_ring, outs_label, ring_size
from bench.lora_meta import META_CASES, meta_advice, time_meta
from bench.lora_timing import copy_bandwidth, time_base_gemm, time_loop, time_ours
from bench.lora_tune import ALL_SWEEPS, TUNE_SWEEPS, tune
from dataplane.kernels import LoraWorkspace
from dataplane.kernels.triton import configs
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.kernels.triton.fused_ops import fused_fits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="skip loop/base/extras")
    ap.add_argument("--no-loop", action="store_true", help="skip the (slow) loop baseline")
    ap.add_argument("--only", default="", help="comma list: scenarios whose name has one")
    ap.add_argument("--no-stacked", action="store_true", help="skip the stacked-layout rings")
    ap.add_argument("--tune-sweeps", default=",".join(TUNE_SWEEPS),
                    help=f"comma list of --tune's sweeps, from {','.join(ALL_SWEEPS)}")
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
            sweeps = tuple(w for w in args.tune_sweeps.split(",") if w)
            results["tuned"] = tune(backend, log, sweeps)
        except Exception as exc:  # keep benchmarking with what we have
            log(f"tuning failed: {type(exc).__name__}: {exc}")
        log(f"tuning took {time.time() - t0:.0f} s")
        tuned = os.path.join(args.out, "tuned_configs.json")
        with open(tuned, "w") as f:  # ADAPTERPLANE_LORA_TUNED=<this file> installs it
            json.dump({"fused": configs.fused_table_json(), **configs.two_kernel_tables_json()},
                      f, indent=1)
        log(f"fused, shrink and expand tables written to {tuned}")
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
        return f"{sc.name} {kind} {outs_label(sc)}"

    def path(sc: Scenario) -> str:
        """Which launch ``add_lora`` takes for this step (all slots live)."""
        cfg = configs.fused_config(sc.rows, sc.max_rank, sc.d_in, sc.outs)
        if cfg is None:
            return "two kernels"
        fits = fused_fits(sc.rows, sc.n, sc.d_in, sc.outs, sc.max_rank, cfg,
                          backend.workspace_numel(sc.rows, len(sc.outs), sc.max_rank),
                          LoraWorkspace.COUNTERS, torch.device("cuda"))  # fmt: skip
        return "fused" if fits else "two kernels (fused_fits)"

    only = [w for w in args.only.split(",") if w]
    for sc in [s for s in SCENARIOS + EXTRA if not only or any(w in display(s) for w in only)]:
        ring = build_ring(sc, "scattered")
        ours = time_ours(sc, ring, backend)
        two_k = ours["ours"]
        if configs.fused_config(sc.rows, sc.max_rank, sc.d_in, sc.outs) is not None:
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
