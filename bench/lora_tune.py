"""``--tune``: sweeps of the LoRA kernel tables that are not settled.

Each sweep installs candidates into :mod:`dataplane.kernels.triton.configs`, times them
on rings of layers, and leaves the winner installed; ``bench/lora_kernels.py --tune`` then
writes the tables to ``tuned_configs.json`` (``configs.fused_table_json`` and
``configs.two_kernel_tables_json``), the layout ``configs.load_tuned`` reads and
``dataplane/kernels/triton/tuned/h200.json`` holds.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.lora_cases import Scenario, build_ring, mixed_cases, outs_label
from bench.lora_timing import time_ours
from dataplane.kernels.triton import configs
from dataplane.kernels.triton.backend import TritonLoraBackend


def _installer(
    table: dict[tuple[int, int], Any], t_keys: tuple[int, ...], r_keys: tuple[int, ...]
) -> Callable[[object], None]:
    """Installer of a shrink or expand candidate (``table``: ``configs.SHRINK_TABLE`` or
    ``configs.EXPAND_TABLE``) for the given T classes and rank buckets."""

    def put(c: Any) -> None:
        for tk in t_keys:
            for r_key in r_keys:
                table[(tk, r_key)] = dataclasses.replace(c, block_r=min(64, r_key))

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
        each = ", ".join(f"{sc.name}{'' if sc.outs == (4096,) else ' ' + outs_label(sc)} {t:.2f}"
                         for (sc, _), t in zip(built, times, strict=True))  # fmt: skip
        log(f"  {c}: {metric} geomean {math.exp(total / len(built)):.2f} µs ({each})")
        if total < best_t:
            best, best_t = c, total
    if best is None:
        raise RuntimeError(f"no candidate ran: {cands}")
    install(best)
    return best, math.exp(best_t / len(built))


def _shape_cases(shape: str, rows: int, ns: tuple[int, ...], tp: int = 1) -> list[Scenario]:
    """Llama-8B decode module of ``shape`` class (rank 16), ``rows`` rows over each ``n``;
    ``tp`` > 1: that module's tensor-parallel shard (q/k/v and gate/up output-sharded, o
    and down input-sharded), which ``configs.fused_shape`` puts in the same class."""
    outs, d_in = {
        "qkv": ((4096 // tp, 1024 // tp, 1024 // tp), 4096), "square": ((4096,), 4096 // tp),
        "wide": ((14336 // tp, 14336 // tp), 4096), "deep": ((4096,), 14336 // tp),
    }[shape]  # fmt: skip
    assert configs.fused_shape(d_in, outs) == shape
    return [Scenario("decode", rows, n, (16,), outs, d_in) for n in ns]


# (per_sm, min_split, pipe, n_elems, block_k) candidates per (T class, shape class);
# n_elems 4096 = 256-column tiles at rank 16 (8192: 512); block_k 0 = the class's own
# (256 at T <= 64, 128 above). Winners of the last run are first.
FUSED_CANDIDATES = (
    (2, 1, 3, 8192, 0), (2, 2, 3, 8192, 0), (2, 2, 0, 8192, 0), (3, 1, 3, 8192, 0),
    (2, 1, 0, 8192, 0), (3, 2, 3, 8192, 0),
    (2, 2, 0, 4096, 0), (2, 2, 3, 4096, 0), (2, 1, 3, 4096, 0), (3, 1, 3, 4096, 0),
    (2, 1, 3, 8192, 256), (2, 1, 3, 8192, 512), (2, 1, 3, 4096, 512),
)  # fmt: skip


def _fused_grid_candidates(cur: configs.FusedConfig, t_key: int) -> list[configs.FusedConfig]:
    return [dataclasses.replace(cur, per_sm=p, min_split=m, pipe=pp, n_elems=ne,
                                block_k=bk or cur.block_k)
            for p, m, pp, ne, bk in FUSED_CANDIDATES]  # fmt: skip


# (num_stages, num_warps, pdl, weighted) tried around each class's current entry: the
# grid sweep keeps 3 stages / 4 warps; deeper pipelines keep more factor bytes in flight
# per program, PDL overlaps a launch with the end of the one before, weighted gives
# wide slices (q of q/k/v) more items.
FUSED_DEPTH_CANDIDATES = (
    (3, 4, 0, 0), (4, 4, 0, 0), (5, 4, 0, 0), (2, 4, 0, 0), (3, 8, 0, 0), (4, 8, 0, 0),
    (3, 4, 1, 0), (4, 4, 1, 0), (3, 4, 0, 1), (3, 4, 1, 1),
)  # fmt: skip


def _fused_depth_candidates(cur: configs.FusedConfig, t_key: int) -> list[configs.FusedConfig]:
    return [dataclasses.replace(cur, num_stages=st, num_warps=nw, pdl=pdl, weighted=wt)
            for st, nw, pdl, wt in FUSED_DEPTH_CANDIDATES]  # fmt: skip


def _tune_fused(backend: TritonLoraBackend, log: Callable[[str], None], label: str,
                candidates: Callable[[configs.FusedConfig, int], list[configs.FusedConfig]],
                tp_cases: bool = False) -> dict[str, object]:
    """Fused launch per (T class, shape class) over ``candidates(current entry)``:
    ``grid`` = ``per_sm``, ``min_split``, the expand loop (``pipe``), the column tile
    (``n_elems``) and ``block_k`` (``FUSED_CANDIDATES``); ``depth`` = pipeline stages,
    warps and PDL (``FUSED_DEPTH_CANDIDATES``); ``classes`` = the other classes' entries
    (``_class_candidates``). Cases: the Llama-8B module of the class at
    T = 128 rows (T class 256) or 64 (T class 64, also installed for 16), over 16 and 50
    (64) slots — a step with 16 / 128 Zipf(1.0) adapters has about that many live — plus
    1 slot for the square class; ``tp_cases`` adds the module's TP=2 shard at T = 64 (the
    TP bench's decode step)."""
    chosen: dict[str, object] = {}
    for t_key, rows, many in ((256, 128, 50), (64, 64, 64)):
        for shape in configs.FUSED_SHAPES:
            ns = (1, 16, many) if shape == "square" else (16, many)
            cases = _shape_cases(shape, rows, ns)
            if tp_cases and t_key == 64:
                cases += _shape_cases(shape, rows, (16, many), tp=2)
            built = [(sc, build_ring(sc, "scattered")) for sc in cases]
            keys = [(t, shape) for t in ((16, 64) if t_key == 64 else (t_key,))]

            def put(c: object, keys: list[tuple[int, str]] = keys) -> None:
                for k in keys:
                    configs.FUSED_TABLE[k] = c  # type: ignore[assignment]

            cands = candidates(configs.FUSED_TABLE[keys[0]], t_key)
            best, t = _sweep(put, cands, built, backend, "ours", log)
            log(f"tuned fused {label} T<={t_key} {shape}: {best} ({t:.2f} µs)")
            chosen[f"fused {t_key} {shape}"] = repr(best)
            del built
            torch.cuda.empty_cache()
    return chosen


def _class_candidates(cur: configs.FusedConfig, t_key: int) -> list[configs.FusedConfig]:
    """The class's entry and every other class's entry at T class ``t_key`` (is a TP
    shard better served by another class's grid?)."""
    others = [configs.FUSED_TABLE[(t_key, s)] for s in configs.FUSED_SHAPES]
    return list(dict.fromkeys([cur, *others]))


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
    timed first). Winners stay installed.
    """
    t0 = time.time()
    chosen: dict[str, object] = {}
    committed = configs.PREFILL_SHRINK_CANDIDATES[0]
    ranked: list[tuple[float, configs.ShrinkConfig]] = []
    for group, r_keys in ((64, (64, 128, 256)), (16, (16, 32))):
        if group == 64:
            cands: list[object] = list(configs.PREFILL_SHRINK_CANDIDATES)
        else:
            # the current r = 16 entry first (the mixed sweep may have tuned it: its
            # `pack` and `pdl` carry over to the r = 64 finalists, which lack them)
            current = configs.SHRINK_TABLE[(4096, 16)]
            best64 = [c for _, c in sorted(ranked, key=lambda p: p[0])]
            others = [dataclasses.replace(c, block_r=current.block_r, pack=current.pack,
                                          pdl=current.pdl)
                      for c in [committed, *[c for c in best64 if c != committed]]]
            cands = [current, *[c for c in others if c != current][:SHRINK_R16_FINALISTS + 1]]
        built = [(sc, build_ring(sc, "scattered"))
                 for sc in (Scenario("prefill", 4096, n, (group,)) for n in (4, 32))]  # fmt: skip
        put = _installer(configs.SHRINK_TABLE, (4096, 1 << 30), r_keys)
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
                assert isinstance(c, configs.ShrinkConfig)
                ranked.append((geo, c))
            if geo < best_t:
                best, best_t = c, geo
        if best is None:
            raise RuntimeError(f"no prefill shrink candidate ran for r={group}")
        put(best)
        log(f"tuned prefill shrink r-group {group}: {best} ({best_t:.2f} µs add_lora geomean)")
        chosen[f"shrink 4096 r{group}"] = repr(best)
        del built
        torch.cuda.empty_cache()
    log(f"prefill shrink sweep took {time.time() - t0:.0f} s")
    return chosen


TUNE_SWEEPS = ("expand", "shrink", "fused")  # what `--tune` runs by default
ALL_SWEEPS = (*TUNE_SWEEPS, "mixed", "fuseddepth", "prefillfused", "fusedtp")

# Mixed-step (T class 1024) candidates: the committed entry first.
MIXED_EXPAND_CANDIDATES = tuple(configs.ExpandConfig(*c) for c in (
    (32, 128, 64, 4, 3, 2), (16, 128, 64, 4, 3, 4), (16, 256, 64, 4, 2, 2),
    (32, 128, 64, 4, 3, 8), (16, 128, 64, 4, 3, 8), (32, 64, 64, 4, 3, 4),
))  # fmt: skip
MIXED_SHRINK_CANDIDATES = tuple(configs.ShrinkConfig(*c) for c in (
    (32, 64, 128, 16, 4, 3), (16, 64, 128, 16, 4, 3), (16, 64, 256, 16, 4, 3),
    (32, 64, 128, 16, 4, 3, 4), (16, 64, 128, 32, 4, 3, 3), (64, 64, 128, 8, 4, 3),
    # row-weighted splits (`row_split`): full prefill tiles get more K splits than
    # one-row decode tiles
    (64, 64, 128, 32, 4, 3, 2, False, 16), (64, 64, 128, 32, 4, 3, 1, False, 16),
    (32, 64, 128, 32, 4, 3, 2, False, 8),
))  # fmt: skip


def _tune_mixed(two: TritonLoraBackend, log: Callable[[str], None]) -> dict[str, object]:
    """Mixed steps, rank <= 32: the expand, then the shrink with the expand winner
    installed. T class 1024 (257-1024 rows, the engine's typical mixed step) over the four
    modules of a 704-row step; T class 4096 (the trace's large mixed steps, 1025-4096
    rows) over a 2,600-row step's modules plus the square module's pure prefill T = 4096
    at n = 4 and 32 (the same class: a winner must not give prefill back). Metric: the
    two-kernel add_lora (geomean). Winners stay installed for rank buckets 16 and 32; then
    fused candidates for class 1024."""
    chosen: dict[str, object] = {}
    for t_class, t_keys, cases in (
        (1024, (1024,), mixed_cases(704)),
        (4096, (4096, 1 << 30), [*mixed_cases(2600),
                                 *(Scenario("prefill", 4096, n, (16,)) for n in (4, 32))]),
    ):
        built = [(sc, build_ring(sc, "scattered")) for sc in cases]
        for name, table, cands in (
            ("expand", configs.EXPAND_TABLE, MIXED_EXPAND_CANDIDATES),
            ("shrink", configs.SHRINK_TABLE, MIXED_SHRINK_CANDIDATES),
        ):
            put = _installer(table, t_keys, (16, 32))
            current = table[(t_class, 16)]
            others = [c for c in cands
                      if dataclasses.replace(c, block_r=current.block_r) != current]
            best, t = _sweep(put, [current, *others], built, two, "ours", log)
            log(f"tuned mixed {name} (T<={t_class}, r<=32): {best} "
                f"({t:.2f} µs add_lora geomean)")
            chosen[f"{name} {t_class} r16"] = repr(best)
        chosen.update(_tune_shrink_pack(t_class, t_keys, built, two, log))
        chosen.update(_tune_two_kernel_pdl(t_class, t_keys, built, two, log))
        if t_class == 1024:
            chosen.update(_tune_mixed_fused(built, two, log))
        del built
        torch.cuda.empty_cache()
    return chosen


def _tune_shrink_pack(t_class: int, t_keys: tuple[int, ...], built: list,
                      two: TritonLoraBackend, log: Callable[[str], None]
                      ) -> dict[str, object]:
    """The class's shrink winner with every slice of q/k/v and gate/up in one program
    (``pack``: ``x`` streamed once per module instead of once per slice), kept where the
    add_lora geomean drops."""
    winner = configs.SHRINK_TABLE[(t_class, 16)]
    put = _installer(configs.SHRINK_TABLE, t_keys, (16, 32))
    cands = [dataclasses.replace(winner, pack=p) for p in (0, 64)]
    best, t = _sweep(put, cands, built, two, "ours", log)
    assert isinstance(best, configs.ShrinkConfig)
    log(f"mixed T<={t_class} shrink pack={best.pack} ({t:.2f} µs add_lora geomean)")
    return {f"shrink pack {t_class}": best.pack}


def _tune_two_kernel_pdl(t_class: int, t_keys: tuple[int, ...], built: list,
                         two: TritonLoraBackend, log: Callable[[str], None]
                         ) -> dict[str, object]:
    """The class's shrink and expand winners launched as programmatic dependent launches
    (both or neither), kept where the add_lora geomean drops."""
    tables: dict[str, dict[tuple[int, int], Any]] = {
        "shrink": configs.SHRINK_TABLE, "expand": configs.EXPAND_TABLE}
    winners = {n: table[(t_class, 16)] for n, table in tables.items()}

    def put(pdl: object) -> None:
        for n, table in tables.items():
            _installer(table, t_keys, (16, 32))(dataclasses.replace(winners[n], pdl=pdl))

    best, t = _sweep(put, [0, 1], built, two, "ours", log)
    log(f"mixed T<={t_class} two-kernel pdl={best} ({t:.2f} µs add_lora geomean)")
    return {f"two-kernel pdl {t_class}": best}


# Fused candidates for mixed steps: (block_m, block_k, per_sm, min_split, pipe, n_elems).
MIXED_FUSED_CANDIDATES = (
    (16, 128, 2, 1, 3, 4096), (16, 128, 2, 2, 3, 4096), (32, 128, 2, 1, 3, 4096),
    (16, 256, 2, 1, 3, 4096), (16, 128, 3, 1, 3, 8192), (32, 128, 2, 2, 3, 8192),
)  # fmt: skip


def _tune_mixed_fused(built: list, two: TritonLoraBackend,
                      log: Callable[[str], None]) -> dict[str, object]:
    """Per module class, one launch instead of two on the mixed step: each fused
    candidate in ``FUSED_TABLE[(1024, class)]``, kept only where it beats the
    two-kernel ``add_lora`` (winners above installed) on the same case."""
    fused = TritonLoraBackend(fused=True)
    chosen: dict[str, object] = {}
    for sc, ring in built:
        shape = configs.fused_shape(sc.d_in, sc.outs)
        key = (1024, shape)
        configs.FUSED_TABLE.pop(key, None)
        two_t = time_ours(sc, ring, two, ("ours",))["ours"]

        def put(c: object, key: tuple[int, str] = key) -> None:
            configs.FUSED_TABLE[key] = c  # type: ignore[assignment]

        cands = [configs.FusedConfig(bm, bk, 32, 4, 3, per_sm=p, min_split=m, pipe=pp,
                                     n_elems=ne)
                 for bm, bk, p, m, pp, ne in MIXED_FUSED_CANDIDATES]  # fmt: skip
        best, t = _sweep(put, cands, [(sc, ring)], fused, "ours", log)
        if t < two_t:
            log(f"tuned mixed fused {shape}: {best} ({t:.2f} µs vs two kernels {two_t:.2f})")
            chosen[f"fused 1024 {shape}"] = repr(best)
        else:
            configs.FUSED_TABLE.pop(key, None)
            log(f"mixed {shape}: two kernels kept ({two_t:.2f} µs; best fused {best} "
                f"{t:.2f})")
    return chosen


# Fused candidates for T class 4,096 (prefill): (block_m, block_k, split_k, warps, per_sm,
# n_elems). Taller row tiles than decode: a 64-row tile of one adapter streams 64 rows of
# x per A byte, so A and B (re-read from L2 by every tile of the slot) stay small beside x
# and y, and no z partials make the round trip through memory the two kernels make.
PREFILL_FUSED_CANDIDATES = (
    (64, 128, 8, 4, 2, 8192), (64, 128, 8, 8, 2, 8192), (32, 128, 8, 4, 2, 8192),
    (64, 256, 8, 8, 2, 8192), (32, 128, 16, 4, 3, 4096), (64, 128, 4, 4, 2, 8192),
    (128, 64, 8, 8, 2, 8192),
)  # fmt: skip


def _tune_prefill_fused(two: TritonLoraBackend, log: Callable[[str], None]
                        ) -> dict[str, object]:
    """The square module class at T class 4,096 as one fused launch
    (``FUSED_TABLE[(4096, "square")]``) over prefill T = 4096 n = 4 / 32 at ranks 16 and
    64 and the 2,600-row mixed step's o projection (the class's entry serves them all),
    kept only where its add_lora geomean beats the two kernels' on the same cases."""
    key = (4096, "square")
    cases = [Scenario("prefill", 4096, n, (r,)) for r in (16, 64) for n in (4, 32)]
    cases.append(next(sc for sc in mixed_cases(2600) if sc.outs == (4096,) and sc.d_in == 4096))
    built = [(sc, build_ring(sc, "scattered")) for sc in cases]
    configs.FUSED_TABLE.pop(key, None)
    times = [time_ours(sc, ring, two, ("ours",))["ours"] for sc, ring in built]
    two_t = math.exp(sum(math.log(t) for t in times) / len(times))
    log(f"prefill square two kernels: {two_t:.2f} µs add_lora geomean")

    def put(c: object) -> None:
        configs.FUSED_TABLE[key] = c  # type: ignore[assignment]

    cands = [configs.FusedConfig(bm, bk, sk, w, 3, per_sm=p, n_elems=ne, min_split=1, pipe=3)
             for bm, bk, sk, w, p, ne in PREFILL_FUSED_CANDIDATES]  # fmt: skip
    best, t = _sweep(put, cands, built, TritonLoraBackend(fused=True), "ours", log)
    del built
    torch.cuda.empty_cache()
    if t < two_t:
        log(f"tuned prefill fused square: {best} ({t:.2f} µs vs two kernels {two_t:.2f})")
        return {"fused 4096 square": repr(best)}
    configs.FUSED_TABLE.pop(key, None)
    log(f"prefill square: two kernels kept ({two_t:.2f} µs; best fused {best} {t:.2f})")
    return {}


def tune(
    backend: TritonLoraBackend,
    log: Callable[[str], None],
    sweeps: tuple[str, ...] = TUNE_SWEEPS,
) -> dict[str, object]:
    """Sweep the open choices, keep the winners installed in the ``configs`` tables.

    1. Prefill expand (T = 4096, n in {4, 32}), rank groups 16 and 64 apart:
       ``Bt``- vs ``y``-prefetching column loop, row tile, column tile, tiles
       per program (metric: the expand alone, two-kernel path).
    2. Fused launch per T class and module shape class (``_tune_fused``, grid):
       programs per SM, minimum split, expand pipelining (metric: add_lora).
    3. Prefill shrink (``_tune_prefill_shrink``): row tile, ``BLOCK_K``,
       stages, programs per SM (hence K splits), evict-first ``x``; r = 16
       and r = 64 apart, with the expand winners of 1 installed.
    4. ``mixed`` (not in the default ``TUNE_SWEEPS``): the T class 1024 expand and
       shrink on mixed-step cases (``_tune_mixed``), then fused candidates for that
       class per module class (kept only where faster than the two kernels).
    5. ``fuseddepth`` (not in the default): each fused entry with other pipeline
       depths, warps and PDL (``_tune_fused``, depth).
    6. ``prefillfused`` (not in the default): the square class at T class 4,096 as one
       fused launch with tall row tiles, kept only where faster (``_tune_prefill_fused``).
    7. ``fusedtp`` (not in the default): each decode fused entry against the other
       classes' entries, on the TP=1 modules and (T class 64) their TP=2 shards
       (``_tune_fused``, classes).
    ``sweeps`` picks among them (``ALL_SWEEPS`` names).
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
        # r = 64 runs at ~1.9 TB/s of y where r = 16 reaches ~2.7: its 4x larger products
        # may not overlap the y stream; deeper pipeline, taller / wider tiles (fewer B
        # re-reads, more bytes in flight per program)
        ec(64, 128, 64, 4, 4, 4),
        ec(128, 128, 64, 8, 3, 2),
        ec(64, 256, 64, 8, 3, 2),
    ]
    for group, r_keys in ((16, (16, 32)), (64, (64, 128, 256))) if "expand" in sweeps else ():
        built = [(sc, build_ring(sc, "scattered"))
                 for sc in (Scenario("prefill", 4096, n, (group,)) for n in (4, 32))]  # fmt: skip
        put = _installer(configs.EXPAND_TABLE, (4096, 1 << 30), r_keys)
        best, t = _sweep(put, exp_c, built, two, "expand", log)
        log(f"tuned prefill expand r-group {group}: {best} ({t:.2f} µs)")
        chosen[f"expand 4096 r{group}"] = repr(best)
        del built
        torch.cuda.empty_cache()
    if "shrink" in sweeps:
        chosen.update(_tune_prefill_shrink(two, log))
    if "fused" in sweeps:
        chosen.update(_tune_fused(backend, log, "grid", _fused_grid_candidates))
    if "fuseddepth" in sweeps:
        chosen.update(_tune_fused(backend, log, "depth", _fused_depth_candidates))
    if "mixed" in sweeps:
        chosen.update(_tune_mixed(two, log))
    if "prefillfused" in sweeps:
        chosen.update(_tune_prefill_fused(two, log))
    if "fusedtp" in sweeps:
        chosen.update(_tune_fused(backend, log, "classes", _class_candidates, tp_cases=True))
    return chosen
