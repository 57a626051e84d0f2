"""Could a mixed step's prefill rows get their LoRA from the base GEMM itself? A probe.

In a mixed step most rows are a few prefill runs (one adapter each); their LoRA today is
the segmented shrink + expand over the whole step, and the expand reads and writes ``y``
once more. The alternative timed here ("concatenated K"): the prefill runs' scaled
bottleneck ``Z`` (``[T, P·slices·r]``, a run's row holds its adapter's block, zeros
elsewhere) rides as extra input columns and their ``Bᵀ`` as extra weight columns, so one
cuBLAS GEMM ``[x | Z] @ [W | B]ᵀ`` writes ``y`` with their update, and only the decode rows
go through the LoRA kernels. Per Llama-8B module of a ``--rows``-row mixed step (104
decode rows over 50 slots + 3 prefill runs, rank 16), ring of layers, CUDA-graph replay,
µs per layer:

- ``base``: ``y = x Wᵀ`` alone; ``base+K``: the GEMM with the extra columns (its FLOPs);
- ``today``: the base GEMM + ``add_lora`` over every row (what the engine runs);
- ``concat``: the prefill rows' shrink (the segmented kernel over those rows only) + one
  small pass writing ``Z`` + the wide GEMM + ``add_lora`` over the decode rows only.

Timing only: ``Z`` is written from the shrink's first partial (one pass: fp32 in, bf16
out), not summed over splits and scaled, so ``y`` is not the LoRA result; the kernels and
bytes are those such a path would run. ``today`` for gate/up is ``add_lora``; above 1,024
rows the engine folds that expand into SiLU·mul instead.

    python3 bench/lora_concat_probe.py --out $OUT
    TRITON_INTERPRET=1 python3 bench/lora_concat_probe.py --smoke
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_cases import DT, MIXED_DECODE_ROWS, RING_WEIGHT_BYTES, Layer, Scenario, mixed_cases
from bench.lora_timing import graph_time_us, probe_parser
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton.backend import TritonLoraBackend

PREFILL_RUNS = 3  # mixed_cases: slots 0, 1, 2 are the prefill runs


def extra_columns(sc: Scenario) -> int:
    """``P · slices · r`` rounded up to 64 columns (the GEMM's K stays 128-byte aligned)."""
    need = PREFILL_RUNS * len(sc.outs) * sc.max_rank
    return -(-need // 64) * 64


Ring = list[tuple[Layer, torch.Tensor, torch.Tensor]]


def variants(sc: Scenario, backend: TritonLoraBackend, n: int, dev: str, dtype: torch.dtype
             ) -> tuple[dict[str, Callable[[], None]], Ring]:
    """The four ways over a ring of ``n`` layers, and the ring (layer, wide weight, wide x)."""
    d_out, extra = sum(sc.outs), extra_columns(sc)
    ring = [Layer(sc, "scattered", dev) for _ in range(n)]
    if dtype != DT:
        for layer in ring:
            layer.x, layer.y = layer.x.to(dtype), layer.y.to(dtype)
            layer.table.storage.data = layer.table.storage.to(dtype)
    wide = [torch.randn(d_out, sc.d_in + extra, device=dev, dtype=dtype) * 0.02 for _ in ring]
    x_wide = [torch.randn(sc.rows, sc.d_in + extra, device=dev, dtype=dtype) for _ in ring]
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device=dev)
    prefill = slots.clone()
    prefill[:MIXED_DECODE_ROWS] = -1
    decode = slots.clone()
    decode[MIXED_DECODE_ROWS:] = -1
    metas = {name: backend.build_meta(s, LoraMetaBuffers(sc.rows, sc.slots, dev))
             for name, s in (("all", slots), ("prefill", prefill), ("decode", decode))}
    ws = LoraWorkspace(backend.workspace_numel(sc.rows, len(sc.outs), sc.max_rank), dev)
    pairs = list(zip(ring, wide, x_wide, strict=True))

    def base(extra_k: bool) -> Callable[[], None]:
        def run() -> None:
            for layer, w, xw in pairs:
                if extra_k:
                    torch.mm(xw, w.t(), out=layer.y)
                else:
                    torch.mm(layer.x, w[:, :sc.d_in].t(), out=layer.y)

        return run

    def today() -> None:
        for layer, w, _ in pairs:
            torch.mm(layer.x, w[:, :sc.d_in].t(), out=layer.y)
            backend.add_lora(layer.y, layer.x, metas["all"], layer.table.weights, ws)

    def concat() -> None:
        for layer, w, xw in pairs:
            x = xw[:, :sc.d_in]
            z = backend.shrink(x, metas["prefill"], layer.table.weights, ws)[0]
            cols = min(extra, z[0].numel())
            xw[:, sc.d_in:sc.d_in + cols].copy_(z.reshape(sc.rows, -1)[:, :cols])
            torch.mm(xw, w.t(), out=layer.y)
            backend.add_lora(layer.y, x, metas["decode"], layer.table.weights, ws)

    return {"base": base(False), "base+K": base(True), "today": today, "concat": concat}, pairs


def time_module(sc: Scenario, backend: TritonLoraBackend) -> dict[str, float]:
    extra = extra_columns(sc)
    n = max(3, math.ceil(RING_WEIGHT_BYTES / (sum(sc.outs) * (sc.d_in + extra) * 2)))
    fns, _ = variants(sc, backend, n, "cuda", DT)
    out = {k: graph_time_us(f) / n for k, f in fns.items()}
    out["extra_columns"] = extra
    return out


def smoke() -> None:
    """CPU, Triton interpreter, float32, a 120-row mixed step of small q/k/v: ``concat``
    leaves the prefill rows exactly as the wide GEMM wrote them (the LoRA launch reaches
    the decode rows only) and changes every decode row."""
    sc = Scenario("mixed", 120, 8, (16,), (64, 32, 32), 64)
    fns, pairs = variants(sc, TritonLoraBackend(fused=True), 1, "cpu", torch.float32)
    fns["concat"]()
    layer, w, xw = pairs[0]
    gemm = xw @ w.t()
    assert torch.equal(layer.y[MIXED_DECODE_ROWS:], gemm[MIXED_DECODE_ROWS:])
    changed = (layer.y[:MIXED_DECODE_ROWS] != gemm[:MIXED_DECODE_ROWS]).any(dim=1)
    assert bool(changed.all()), "a decode row got no LoRA update"
    print("q/k/v: concat ok")


def main() -> None:
    ap = probe_parser(__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[704, 2048])
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    os.makedirs(args.out, exist_ok=True)
    backend = TritonLoraBackend(fused=True)
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    print("| rows | module | base | base+K | today | concat | LoRA today / concat |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    names = ("q/k/v", "o", "gate/up", "down")
    for rows in args.rows:
        for name, sc in zip(names, mixed_cases(rows), strict=True):
            t = time_module(sc, backend)
            results[f"{name} T={rows}"] = t
            print(f"| {rows} | {name} | {t['base']:.1f} | {t['base+K']:.1f} | {t['today']:.1f} "
                  f"| {t['concat']:.1f} | {t['today'] - t['base']:.1f} / "
                  f"{t['concat'] - t['base']:.1f} |", flush=True)
    with open(os.path.join(args.out, "lora_concat_probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
