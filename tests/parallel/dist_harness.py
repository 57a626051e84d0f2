"""Run a scenario on every rank of a real gloo group (or NCCL, one GPU per rank, with
device="cuda"), one spawn per test module.

`run_world("tests.parallel.scenarios_shards:run", payload)` spawns `world_size` processes with
torch.multiprocessing, each joins a gloo group through a file:// rendezvous, calls the
scenario ``fn(group, payload) -> result`` and saves `result` with torch.save; the caller
gets ``[result of rank 0, result of rank 1, ...]``. A rank that raises fails the call with
its traceback; a hung world is terminated after `timeout_s`.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def _entry(rank: int, world_size: int, init_file: str, target: str, payload: Any,
           out_dir: str, device: str = "cpu") -> None:
    torch.set_num_threads(1)
    from dataplane.parallel import destroy_tp_group, init_tp_group

    module, name = target.split(":")
    fn = getattr(importlib.import_module(module), name)
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"  # cuda: NCCL, one GPU per rank
    group = init_tp_group(rank, world_size, init_method=f"file://{init_file}", device=dev)
    try:
        result = fn(group, payload)
    finally:
        destroy_tp_group(group)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


def run_world(target: str, payload: Any, world_size: int = 2, timeout_s: float = 120.0,
              device: str = "cpu") -> list[Any]:
    with tempfile.TemporaryDirectory() as tmp:
        init_file = str(Path(tmp) / "rendezvous")
        ctx = mp.start_processes(_entry, args=(world_size, init_file, target, payload, tmp, device),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.terminate()
                raise TimeoutError(f"{target} did not finish within {timeout_s} s")
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False)
                for r in range(world_size)]
