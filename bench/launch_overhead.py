"""Host time per launch of the eager LoRA path and of our other Triton ops (CUDA).

Each measurement queues `--calls` launches behind a device spin (`torch.cuda._sleep`), so
the device never drains the queue and the host time is the launch path alone, then
syncs. Cases, on the engine's typical mixed step (Llama-8B q/k/v, T = 704 rows over 53
rank-16 adapters, `lora_cases.Scenario("mixed", ...)`):

- `add_lora, later layers`: the same step's metadata and workspace, call after call (the
  31 layers after the first: the per-step memo prepared the launches once);
- `add_lora, first call of a step`: a new metadata object per call (memo miss: checks,
  configs, workspace views, plans);
- both again with ``ADAPTERPLANE_TRITON_FAST_LAUNCH=0`` (every launch through Triton's
  ``kernel[grid]``);
- `rms_norm` (Triton op, cached plan) and `torch.mm` of the base GEMM as references.

    python3 bench/launch_overhead.py --out $OUT/launch
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lora_cases import Layer, Scenario

from dataplane import triton_launch
from dataplane.kernels import LoraMetaBuffers, LoraWorkspace, get_lora_backend
from dataplane.ops import fused_add_rms_norm


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Median over 5 rounds of host µs per call, the device held by a spin meanwhile."""
    fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s: longer than the host needs for `calls`
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(rounds)[2]


def measure(calls: int) -> list[dict]:
    sc = Scenario("mixed", 704, 53, (16,), (4096, 1024, 1024), 4096)
    layer = Layer(sc, "scattered")
    gen = torch.Generator().manual_seed(0)
    row_slot = torch.tensor(sc.row_slot(gen), dtype=torch.int32, device="cuda")
    backend = get_lora_backend("cuda")
    buffers = LoraMetaBuffers(sc.rows, sc.slots, "cuda")
    w = layer.table.weights
    ws = LoraWorkspace(backend.workspace_numel(sc.rows, w.num_slices, w.max_rank), "cuda")
    meta = backend.build_meta(row_slot, buffers)
    metas = [backend.build_meta(row_slot, buffers) for _ in range(calls + 1)]
    residual = torch.randn(sc.rows, 4096, device="cuda", dtype=torch.bfloat16)
    weight = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    base_w = torch.randn(sum(sc.outs), sc.d_in, device="cuda", dtype=torch.bfloat16)
    results = []
    for fast in ("1", "0"):
        os.environ["ADAPTERPLANE_TRITON_FAST_LAUNCH"] = fast
        triton_launch.enabled.cache_clear()
        label = "cached compiled kernels" if fast == "1" else "kernel[grid]"
        fresh = iter(metas * 6)  # host_us makes 1 + 5 * calls calls
        cases: dict[str, Callable[[], object]] = {
            "add_lora, later layers of a step": lambda: backend.add_lora(
                layer.y, layer.x, meta, w, ws),
            "add_lora, first call of a step": lambda it=fresh: backend.add_lora(  # type: ignore[misc]
                layer.y, layer.x, next(it), w, ws),
            "fused add + RMSNorm (Triton)": lambda: fused_add_rms_norm(
                layer.x, residual, weight, 1e-5, "triton"),
        }
        for name, fn in cases.items():
            us = host_us(fn, calls)
            results.append({"case": name, "launch": label, "host_us": us})
            print(f"# {name} [{label}]: {us:.1f} µs", file=sys.stderr, flush=True)
    us = host_us(lambda: torch.mm(layer.x, base_w.t()), calls)
    results.append({"case": "torch.mm (base q/k/v GEMM)", "launch": "torch", "host_us": us})
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs CUDA")
    results = measure(args.calls)
    lines = ["| call | launch path | host µs per call |", "|---|---|---|"]
    lines += [f"| {r['case']} | {r['launch']} | {r['host_us']:.1f} |" for r in results]
    print("\n".join(lines))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "launch_overhead.json").write_text(
            json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
