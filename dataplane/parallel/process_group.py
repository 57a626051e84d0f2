"""Process-group setup for tensor parallelism: one process per device, one TP group.

Launch model (documented choice): one agent per node drives the TP group of its GPUs —
the agent process is rank 0 and spawns ranks 1..N-1 (agent/tp_ranks.py, file://
rendezvous; `init_tp_group_from_env` also accepts a torchrun-style environment: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); every process builds the same modules
and loads only its shards. NCCL on
CUDA, gloo on CPU (tests). The whole world is the TP group (no pipeline/data axes yet).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.errors import ProcessGroupError


def backend_for(device: torch.device) -> str:
    """"nccl" for CUDA devices, "gloo" otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def single_rank_group(device: torch.device | str = "cpu") -> TPGroup:
    """TP=1: the same modules, every collective an identity, torch.distributed unused."""
    return TPGroup(rank=0, size=1, device=torch.device(device))


def init_tp_group(rank: int, world_size: int, *, init_method: str,
                  device: torch.device | str | None = None,
                  timeout_s: float = 120.0) -> TPGroup:
    """Join (or create) the default process group and return this rank's `TPGroup`.

    `init_method` is a torch.distributed URL ("tcp://127.0.0.1:29500", "file:///tmp/x").
    `device` defaults to ``cuda:<rank % device_count>`` when CUDA is available, else CPU.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ProcessGroupError(f"rank {rank} outside world of {world_size}")
    if device is None:
        device = (torch.device("cuda", rank % torch.cuda.device_count())
                  if torch.cuda.is_available() else torch.device("cpu"))
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world_size == 1:
        return single_rank_group(dev)
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise ProcessGroupError("a different default process group is already initialised")
    else:
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend_for(dev), init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s),
                                **kwargs)  # type: ignore[arg-type]
    return TPGroup(rank=rank, size=world_size, device=dev, group=dist.group.WORLD)


def init_tp_group_from_env(env: Mapping[str, str] | None = None,
                           device: torch.device | str | None = None) -> TPGroup:
    """`init_tp_group` from torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    LOCAL_RANK picks the CUDA device when `device` is None.
    """
    env = os.environ if env is None else env
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
    except (KeyError, ValueError) as exc:
        raise ProcessGroupError(f"bad or missing torchrun environment: {exc!r}") from exc
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
    return init_tp_group(rank, world, init_method=f"tcp://{addr}:{port}", device=device)


def destroy_tp_group(group: TPGroup) -> None:
    """Tear down the default process group (no-op for TP=1)."""
    if group.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
