"""Rank 0 -> all ranks control messages (plans, adapter loads, stop) over a CPU group.

Why a separate channel: the TP collectives run on NCCL (CUDA tensors only); control
messages are small pickled Python objects (a `BatchPlan`, an adapter's factors) that the
leader sends once per step. They go over a gloo group created alongside the TP group, as
two broadcasts (length, then bytes). Both are counted in the TP group's counter with
purpose "control" (kind "broadcast"), never "base"/"lora".

Every rank of the TP group must construct the channel at the same point (creating the
gloo subgroup is collective). TP=1: nothing is sent, `recv` is an error.
"""

from __future__ import annotations

import pickle
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist

from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.errors import ProcessGroupError

BROADCAST = "broadcast"


class ControlChannel:
    """Leader (rank 0) broadcasts Python objects; followers receive them in order."""

    def __init__(self, group: TPGroup) -> None:
        self.group = group
        self.pg: dist.ProcessGroup | None = None
        if group.size > 1:
            # gloo subgroup over the same ranks: works whether the TP group is NCCL or gloo
            self.pg = dist.new_group(ranks=list(range(group.size)), backend="gloo")

    @property
    def is_leader(self) -> bool:
        return self.group.rank == 0

    def _count(self, nbytes: int) -> None:
        # broadcast: the root sends nbytes to each of N-1 ranks (tree/ring: (N-1)/N per rank)
        ring = Fraction((self.group.size - 1) * nbytes, self.group.size)
        self.group.counter.record("control", BROADCAST, nbytes, ring)

    def send(self, message: Any) -> None:
        """Leader: broadcast `message` (picklable) to every follower. No-op for TP=1."""
        if not self.is_leader:
            raise ProcessGroupError("only rank 0 sends control messages")
        if self.pg is None:
            return
        payload = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
        dist.broadcast(length, src=0, group=self.pg)
        dist.broadcast(payload, src=0, group=self.pg)
        self._count(8)
        self._count(payload.numel())

    def recv(self) -> Any:
        """Follower: the leader's next message."""
        if self.is_leader or self.pg is None:
            raise ProcessGroupError("only followers of a TP group > 1 receive")
        length = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(length, src=0, group=self.pg)
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
        dist.broadcast(payload, src=0, group=self.pg)
        self._count(8)
        self._count(payload.numel())
        return pickle.loads(payload.numpy().tobytes())  # same-host TP ranks of one agent

    def close(self) -> None:
        """Collective (every rank calls it after the stop message): a barrier first, so
        that no rank tears the gloo group down while the stop broadcast is still in
        flight to another (a follower would then wait for it forever, and the leader in
        the NCCL teardown that needs the follower)."""
        if self.pg is not None and dist.is_initialized():
            dist.barrier(group=self.pg)
            dist.destroy_process_group(self.pg)
            self.pg = None
