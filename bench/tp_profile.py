"""Device time of TP decode steps by kernel kind (`bench/tp.py --profile N`).

`profile_decode` runs N more decode steps after the timed ones through the leader's
`execute` (the followers run them in `Engine.serve()`) and profiles them on rank 0; an
untimed first step lines the ranks up before the record starts.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from dataplane.core import BatchPlan, Sequence, build_batch_plan

BLOCK = 16


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


KERNEL_KINDS = (("lora", ("lora",)), ("nccl", ("nccl",)),
                ("gemm", ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas")),
                ("attention", ("attn", "attention", "paged")))


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def profile_decode(execute: Callable[[BatchPlan], torch.Tensor], device: torch.device,
                   seqs: list[Sequence], steps: int, generation: int) -> dict[str, Any] | None:
    """`steps` more decode steps, after one untimed; on rank 0 under torch.profiler: device
    µs per step of each kernel kind (LoRA, NCCL, GEMM, attention, other), launches per step
    and the busiest kernels. An NCCL kernel's time includes waiting for the other ranks
    (the untimed first step absorbs the profiler's start on rank 0 alone)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule

    # one warm-up step first: the profiler's start on rank 0 alone is not in the record
    prof = profile(activities=[ProfilerActivity.CUDA],
                   schedule=schedule(wait=0, warmup=1, active=steps))
    sync(device)
    prof.__enter__()
    for step in range(steps + 1):
        plan = build_batch_plan([], seqs, block_size=BLOCK, generation=generation + step,
                                check=False)
        execute(plan)
        for s in seqs:
            s.num_computed_tokens = s.num_tokens
            s.token_ids.append(5)
        if step == 0:  # warm-up done before the record starts
            sync(device)
            prof.step()
    sync(device)
    prof.__exit__(None, None, None)
    per_kind: dict[str, dict[str, float]] = {}
    top = []
    for ev in prof.key_averages():
        us = ev.device_time_total
        if us <= 0:
            continue
        kind = kernel_kind(ev.key)
        agg = per_kind.setdefault(kind, {"us_per_step": 0.0, "launches_per_step": 0.0})
        agg["us_per_step"] += us / steps
        agg["launches_per_step"] += ev.count / steps
        top.append((us / steps, ev.count / steps, ev.key[:90]))
    top.sort(reverse=True)
    # Median launch per kind: one NCCL kernel that waited long for the other rank (e.g. on
    # a host hiccup there) inflates its kind's total; median x launches does not.
    durations: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == DeviceType.CUDA:
            durations.setdefault(kernel_kind(ev.name), []).append(ev.time_range.elapsed_us())
    for kind, agg in per_kind.items():
        if durations.get(kind):
            agg["median_launch_us"] = statistics.median(durations[kind])
            agg["median_x_launches_us"] = agg["median_launch_us"] * agg["launches_per_step"]
    return {"by_kind": per_kind,
            "top": [{"us_per_step": round(u, 1), "launches_per_step": c, "name": n}
                    for u, c, n in top[:15]]}
