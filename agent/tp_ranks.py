"""One agent per node drives its tensor-parallel ranks: the agent process is rank 0.

`launch_tp_ranks(spec)` spawns ranks 1..N-1 with torch.multiprocessing (spawn), joins the
TP group as rank 0 in the calling (agent) process and returns a `TPRanks` whose `engine`
is rank 0's engine — an `Engine`, so the agent's serving code uses it unchanged.
Every rank builds its engine with the same `build_engine` spec (its shard of the same
checkpoint, `EngineSpec.tp_group`); each step
rank 0 schedules, broadcasts the `BatchPlan`, all ranks execute it (same collectives, same
CUDA graph), and only rank 0 samples and returns tokens. Adapter loads follow the same
path and publish only when all ranks validated their shard (dataplane/engine/lockstep.py).

Devices: rank r uses ``cuda:(N + r)`` (``device="cuda:N"``; ``"cuda"`` is ``cuda:0``), so
several TP agents share a node by their first GPU (an 8-GPU node: four TP=2 agents on
cuda:0, cuda:2, cuda:4, cuda:6), or the CPU (``"cpu"``: gloo, tests).
Rendezvous: a file:// store in a private temporary directory (single node).
`TPRanks.shutdown()` stops the followers and joins them. A follower that dies would leave
rank 0's next collective waiting for the process group's timeout; `TPRanks.watch` notices
the exit at once, and the agent then stops serving and exits (agent/daemon.py) for its
supervisor to restart the whole group.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from dataplane.engine import Engine, EngineConfig, EngineSpec, build_engine
from dataplane.parallel import TPGroup, destroy_tp_group, init_tp_group
from dataplane.parallel.errors import ProcessGroupError
from dataplane.pool.faults import FaultInjector, parse_faults


@dataclass(frozen=True)
class TPLaunchSpec:
    """What every rank builds: the same `EngineConfig` on all ranks.

    `lora_fold`: "auto" | "on" | "off" (`EngineSpec.lora_fold`); `extra_resident_bytes`:
    the fold copies' budget per rank (`EngineSpec.extra_resident_bytes`).
    """

    model_dir: str
    tp_size: int
    device: str = "cuda"
    dtype: str = "bfloat16"
    lora_fold: str = "off"
    engine: EngineConfig = field(default_factory=EngineConfig)
    extra_resident_bytes: int | None = None
    torch_threads: int | None = None
    timeout_s: float = 600.0
    faults: dict[int, str] = field(default_factory=dict)
    """Rank -> faults to inject into its pool (`ADAPTERPLANE_FAULTS` syntax; chaos drills
    and tests); a rank not named reads `ADAPTERPLANE_FAULTS` from its environment."""


def first_cuda_index(device: str) -> int | None:
    """None for "cpu"; N for "cuda:N" (0 for "cuda"): rank r runs on GPU N + r.
    Anything else raises `ProcessGroupError`."""
    if device == "cpu":
        return None
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise ProcessGroupError(f"unknown TP device {device!r} (cpu, cuda or cuda:N)")
    return int(index or 0)


def _rank_device(spec: TPLaunchSpec, rank: int) -> torch.device:
    first = first_cuda_index(spec.device)
    return torch.device("cpu") if first is None else torch.device("cuda", first + rank)


def _build(spec: TPLaunchSpec, rank: int, init_method: str) -> Engine:
    group: TPGroup = init_tp_group(rank, spec.tp_size, init_method=init_method,
                                   device=_rank_device(spec, rank), timeout_s=spec.timeout_s)
    faults = (FaultInjector(parse_faults(spec.faults[rank])) if rank in spec.faults
              else FaultInjector.from_env())
    return build_engine(EngineSpec(spec.model_dir, spec.engine, dtype=spec.dtype,
                                   lora_fold=spec.lora_fold, tp_group=group, faults=faults,
                                   extra_resident_bytes=spec.extra_resident_bytes))


def _follower_main(index: int, spec: TPLaunchSpec, init_method: str) -> None:
    """Process entry of rank ``index + 1``: build, follow rank 0 until stopped."""
    if spec.torch_threads is not None:
        torch.set_num_threads(spec.torch_threads)
    engine = _build(spec, index + 1, init_method)
    try:
        engine.serve()
    finally:
        if engine.tp_group is not None:
            destroy_tp_group(engine.tp_group)


class TPRanks:
    """Rank 0's engine plus the follower processes; `shutdown()` ends them."""

    def __init__(self, engine: Engine, context: Any, tmp: tempfile.TemporaryDirectory[str]
                 ) -> None:
        self.engine = engine
        self._context = context
        self._tmp = tmp
        self._closed = False

    @property
    def group(self) -> TPGroup:
        """Rank 0's TP group."""
        group = self.engine.tp_group
        assert group is not None
        return group

    @property
    def tp_size(self) -> int:
        return self.group.size

    def follower_pids(self) -> list[int]:
        """Process ids of ranks 1..N-1, in rank order."""
        return [] if self._context is None else [int(p.pid) for p in self._context.processes]

    def watch(self, on_lost: Callable[[str], None]) -> None:
        """Call `on_lost(reason)` (from a daemon thread, at most once) when a follower
        exits while the group is up. The group cannot outlive a rank: its next
        collective would block rank 0 until the process group's timeout, so the owner
        stops serving instead (the agent exits for its supervisor to restart the node's
        TP group). Exits after `shutdown()` began are not losses."""
        if self._context is None:
            return
        procs = list(self._context.processes)

        def run() -> None:
            ready = mp_connection.wait([p.sentinel for p in procs])
            if self._closed:
                return
            rank, proc = next((i + 1, p) for i, p in enumerate(procs) if p.sentinel in ready)
            proc.join(timeout=1.0)
            on_lost(f"TP rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}")

        threading.Thread(target=run, name="tp-rank-watch", daemon=True).start()

    def kill_followers(self) -> None:
        """SIGKILL every follower still alive (no collective: for a broken group)."""
        if self._context is not None:
            for proc in self._context.processes:
                if proc.is_alive():
                    proc.kill()

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop followers (they return from `serve()`), leave the group, join them."""
        if self._closed:
            return
        self._closed = True
        self.engine.shutdown()  # the stop message, acknowledged (ControlChannel.close)
        try:
            # Leave the group while the followers exit, not before or after: tearing an
            # NCCL communicator down can wait for the peers' teardown (rank 0 joining the
            # followers first hung the eager TP=2 GPU test until the join timed out).
            left = threading.Thread(target=destroy_tp_group, args=(self.group,),
                                    name="tp-leave", daemon=True)
            left.start()
            deadline = time.monotonic() + timeout_s
            joined = self._context is None
            while not joined and time.monotonic() < deadline:
                # one call returns when *a* follower exits: False while others remain
                joined = self._context.join(timeout=max(0.0, deadline - time.monotonic()))
            left.join(timeout=max(0.0, deadline - time.monotonic()))
            if not joined or left.is_alive():
                if self._context is not None:
                    for proc in self._context.processes:
                        if proc.is_alive():
                            proc.terminate()
                raise ProcessGroupError(f"TP ranks did not stop within {timeout_s} s")
        finally:
            self._tmp.cleanup()


def launch_tp_ranks(spec: TPLaunchSpec) -> TPRanks:
    """Start a TP group of `spec.tp_size` ranks on this node; this process is rank 0."""
    if spec.tp_size < 1:
        raise ProcessGroupError("tp_size must be >= 1")
    first = first_cuda_index(spec.device)
    if first is not None and torch.cuda.device_count() < first + spec.tp_size:
        raise ProcessGroupError(f"tp_size {spec.tp_size} from {spec.device} needs GPUs "
                                f"{first}..{first + spec.tp_size - 1} "
                                f"({torch.cuda.device_count()} visible)")
    if not Path(spec.model_dir, "config.json").is_file():
        raise ProcessGroupError(f"no model at {spec.model_dir!r}")
    tmp = tempfile.TemporaryDirectory(prefix="tp-rdv-")
    init_method = f"file://{os.path.join(tmp.name, 'rendezvous')}"
    context = None
    if spec.tp_size > 1:
        context = mp.start_processes(_follower_main, args=(spec, init_method),
                                     nprocs=spec.tp_size - 1, join=False,
                                     start_method="spawn")
    try:
        engine = _build(spec, 0, init_method)
    except BaseException:
        if context is not None:
            for proc in context.processes:
                proc.terminate()
        tmp.cleanup()
        raise
    return TPRanks(engine, context, tmp)
