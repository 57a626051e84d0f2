"""Where a fused decode LoRA launch spends its time: launch + prologue, shrink, exchange,
expand — measured by shrinking one part of the work at a time on the same config.

For each engine module shape (Llama-3-8B q/k/v, o, gate/up, down) at the engine's
128-row decode step over ~50 live rank-16 slots, one ``lora_fused`` launch per layer over
a ring of layers (weights stream from HBM), CUDA-graph replay, median µs per launch:

- ``full``: the real shapes;
- ``prologue``: every slot's rank set to 0, so each program reads the step's metadata
  and its slot's tables and leaves (launch + prologue);
- ``tiny K``: the input width cut to 64 (the shrink streams almost nothing);
- ``tiny N``: every output slice cut to 16 columns (the expand writes almost nothing);
- ``tiny K+N``: both (launch + prologue + the split-K exchange).

Every variant runs the module's own config (grid, tiles, splits), not the table's pick for
the smaller shape. Derived: shrink ≈ full − tiny K, expand ≈ full − tiny N, exchange ≈
tiny K+N − prologue. The floor is the full case's bytes at the measured copy bandwidth.

Then, as in the engine, each layer's base GEMM writes ``y`` and the launch follows it:
``gemm`` alone, ``gemm+lora``, and ``gemm+lora pdl`` (the config with ``pdl = 1``: a
programmatic dependent launch whose prologue and shrink overlap the GEMM's end); the LoRA's
visible cost is the difference to ``gemm``.

    python3 bench/lora_anatomy.py --out $OUT
    TRITON_INTERPRET=1 python3 bench/lora_anatomy.py --smoke   # CPU: plumbing only
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_cases import DECODE_MODULES, DT, RING_WEIGHT_BYTES, Layer, Scenario, ring_size
from bench.lora_timing import copy_bandwidth, graph_time_us, module_table, probe_parser
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.triton import fused_ops
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.kernels.triton.configs import FusedConfig, fused_config

MODULES = {
    **DECODE_MODULES,
    "o, 1 slot": Scenario("decode", 128, 1, (16,)),  # the fixed cost of a launch
    # 50 live of a 1,024-slot pool: every program reads and prefix-sums all slot counts
    "o, 1,024-slot pool": Scenario("decode", 128, 50, (16,), pool=1024),
}
SMOKE = {  # the same four kinds at interpreter size
    "q/k/v": Scenario("decode", 16, 5, (16,), (128, 32, 32), 64),
    "o": Scenario("decode", 16, 5, (16,), (64,), 64),
    "gate/up": Scenario("decode", 16, 5, (16,), (192, 192), 64),
    "down": Scenario("decode", 16, 5, (16,), (64,), 192),
}
TINY_K, TINY_N = 64, 16


@contextmanager
def pinned_config(cfg: FusedConfig) -> Iterator[None]:
    """Every fused launch inside uses ``cfg`` (the module's own), whatever its shape."""
    original = fused_ops.fused_config
    fused_ops.fused_config = lambda *args, **kwargs: cfg
    try:
        yield
    finally:
        fused_ops.fused_config = original


def ring_launches(sc: Scenario, n: int, backend: TritonLoraBackend, zero_ranks: bool = False,
                  dev: str = "cuda") -> tuple[list[Callable[[], None]], list[Layer]]:
    """A ring of ``n`` layers of ``sc`` and one ``lora_fused`` launch per layer."""
    ring = [Layer(sc, "scattered", dev) for _ in range(n)]
    if zero_ranks:
        for layer in ring:
            layer.table.ranks.zero_()
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device=dev)
    meta = backend.build_meta(slots, LoraMetaBuffers(sc.rows, sc.slots, dev))
    ws = LoraWorkspace(backend.workspace_numel(sc.rows, len(sc.outs), sc.max_rank), dev)

    def launch(layer: Layer) -> Callable[[], None]:
        w = layer.table.weights
        return lambda: fused_ops.launch_fused(
            layer.y, layer.x, w.storage, w.a_rows, w.b_rows, w.ranks, w.scales,
            meta.sorted_rows, meta.slot_counts, meta.slot_starts, ws.buffer, ws.counters,
            list(w.out_features), w.addr_align,
        )  # fmt: skip

    return [launch(layer) for layer in ring], ring


def in_order(calls: list[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for call in calls:
            call()

    return run


def variants(sc: Scenario) -> dict[str, tuple[Scenario, bool]]:
    """name -> (scenario, ranks zeroed)."""
    return {
        "full": (sc, False),
        "prologue": (sc, True),
        "tiny K": (replace(sc, d_in=TINY_K), False),
        "tiny N": (replace(sc, outs=(TINY_N,) * len(sc.outs)), False),
        "tiny K+N": (replace(sc, d_in=TINY_K, outs=(TINY_N,) * len(sc.outs)), False),
    }


def module_config(sc: Scenario) -> FusedConfig:
    cfg = fused_config(sc.rows, sc.max_rank, sc.d_in, sc.outs)
    if cfg is None:
        raise SystemExit(f"{sc.name}: no fused config")
    return cfg


def anatomy(sc: Scenario, backend: TritonLoraBackend, bandwidth: float) -> dict[str, float]:
    n = ring_size(sc)
    out: dict[str, float] = {"ring": n, "floor": sc.floor_bytes() / bandwidth * 1e6}
    with pinned_config(module_config(sc)):
        for name, (variant, zero) in variants(sc).items():
            out[name] = graph_time_us(in_order(ring_launches(variant, n, backend, zero)[0])) / n
            torch.cuda.empty_cache()
    out.update(after_gemm(sc, backend))
    out["shrink"] = out["full"] - out["tiny K"]
    out["expand"] = out["full"] - out["tiny N"]
    out["exchange"] = out["tiny K+N"] - out["prologue"]
    return out


def after_gemm(sc: Scenario, backend: TritonLoraBackend) -> dict[str, float]:
    """µs per layer of the base GEMM alone, then GEMM + launch without and with PDL."""
    n = max(3, -(-RING_WEIGHT_BYTES // (sum(sc.outs) * sc.d_in * 2)))
    launches, ring = ring_launches(sc, n, backend)
    weights = [torch.randn(sum(sc.outs), sc.d_in, device="cuda", dtype=DT) * 0.02
               for _ in ring]

    def gemm() -> None:
        for layer, w in zip(ring, weights, strict=True):
            torch.mm(layer.x, w.t(), out=layer.y)

    def serial() -> None:  # each layer's GEMM writes its y, then its launch
        for layer, w, launch in zip(ring, weights, launches, strict=True):
            torch.mm(layer.x, w.t(), out=layer.y)
            launch()

    cfg = module_config(sc)
    out = {"gemm": graph_time_us(gemm) / n}
    with pinned_config(cfg):
        out["gemm+lora"] = graph_time_us(serial) / n
    with pinned_config(replace(cfg, pdl=1)):
        out["gemm+lora pdl"] = graph_time_us(serial) / n
    return out


def smoke(backend: TritonLoraBackend) -> None:
    """CPU (interpreter): every variant launches; the rank-0 one leaves ``y`` alone,
    the others change it."""
    for name, sc in SMOKE.items():
        with pinned_config(module_config(sc)):
            for variant_name, (variant, zero) in variants(sc).items():
                launches, ring = ring_launches(variant, 1, backend, zero, "cpu")
                before = ring[0].y.clone()
                in_order(launches)()
                if torch.equal(before, ring[0].y) != zero:
                    raise SystemExit(f"{name} {variant_name}: y changed = {not zero} expected")
        print(f"{name}: ok", flush=True)


def main() -> None:
    args = probe_parser(__doc__).parse_args()
    backend = TritonLoraBackend(fused=True)
    if args.smoke:
        smoke(backend)
        return
    os.makedirs(args.out, exist_ok=True)
    bw = max(copy_bandwidth().values()) * 1e9
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}, copy "
          f"{bw / 1e9:.0f} GB/s", flush=True)
    cols = ("full", "floor", "prologue", "tiny K", "tiny N", "tiny K+N", "shrink", "expand",
            "exchange", "gemm", "gemm+lora", "gemm+lora pdl")
    module_table(cols, MODULES, lambda _name, sc: anatomy(sc, backend, bw),
                 os.path.join(args.out, "lora_anatomy.json"))


if __name__ == "__main__":
    main()
