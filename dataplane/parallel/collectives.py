"""Counted collectives: every tensor-parallel byte goes through one small wrapper.

Why: the benchmark and the tests must *count* what a forward sends. Calls and bytes are
separate ledgers, because a small NCCL call costs about the same whatever its size (35–40
µs added to a step on two NVLink H200s, docs/PERFORMANCE.md, "Tensor parallel").
`TPGroup` owns the process group of one TP group and a `CollectiveCounter`; each call
names its purpose ("base" for the base projection's own collectives, "lora" for anything
the adapter branch adds, "control" for the leader's messages, "tokens" for the sampled
tokens the leader hands the followers under async scheduling) so "the LoRA adds no call"
is a checked count, not a claim.

Ledgers per (purpose, kind):
    calls          number of collective calls
    payload_bytes  bytes of the tensor this rank hands to the call
    ring_bytes     logical per-rank traffic of a ring algorithm:
                   all-gather (N-1)/N * output bytes, all-reduce 2(N-1)/N * bytes;
                   a Fraction, exact for any N.
With size 1 nothing is sent and nothing is counted.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

import torch
import torch.distributed as dist

from dataplane.parallel.errors import ProcessGroupError

PURPOSES = ("base", "lora", "control", "tokens")
ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
BROADCAST = "broadcast"


@dataclass
class CollectiveTally:
    calls: int = 0
    payload_bytes: int = 0
    ring_bytes: Fraction = field(default_factory=Fraction)


class CollectiveCounter:
    """Per-(purpose, kind) tallies since the last `reset()`. Thread-safe: the engine's
    thread records while a metrics scrape reads (agent/metrics.py)."""

    def __init__(self) -> None:
        self._tallies: dict[tuple[str, str], CollectiveTally] = defaultdict(CollectiveTally)
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self._tallies.clear()

    def record(self, purpose: str, kind: str, payload_bytes: int, ring_bytes: Fraction) -> None:
        with self._lock:
            tally = self._tallies[(purpose, kind)]
            tally.calls += 1
            tally.payload_bytes += payload_bytes
            tally.ring_bytes += ring_bytes

    def tallies(self) -> dict[tuple[str, str], CollectiveTally]:
        """A copy of the ledgers (e.g. what one captured CUDA graph issues per replay)."""
        with self._lock:
            return {key: CollectiveTally(t.calls, t.payload_bytes, t.ring_bytes)
                    for key, t in self._tallies.items()}

    def add(self, tallies: dict[tuple[str, str], CollectiveTally]) -> None:
        """Add ledgers recorded elsewhere: a graph replay issues its captured collectives
        without running the Python wrappers, so the replayer adds the capture's tally."""
        with self._lock:
            for key, t in tallies.items():
                mine = self._tallies[key]
                mine.calls += t.calls
                mine.payload_bytes += t.payload_bytes
                mine.ring_bytes += t.ring_bytes

    def _matching(self, purpose: str | None, kind: str | None) -> list[CollectiveTally]:
        return [t for (p, k), t in self.tallies().items()
                if purpose in (None, p) and kind in (None, k)]

    def calls(self, purpose: str | None = None, kind: str | None = None) -> int:
        return sum(t.calls for t in self._matching(purpose, kind))

    def payload_bytes(self, purpose: str | None = None, kind: str | None = None) -> int:
        return sum(t.payload_bytes for t in self._matching(purpose, kind))

    def ring_bytes(self, purpose: str | None = None, kind: str | None = None) -> Fraction:
        return sum((t.ring_bytes for t in self._matching(purpose, kind)), Fraction(0))

    def snapshot(self) -> dict[str, dict[str, int | str]]:
        """JSON-friendly view: "purpose/kind" -> calls, payload and ring bytes."""
        return {f"{p}/{k}": {"calls": t.calls, "payload_bytes": t.payload_bytes,
                             "ring_bytes": str(t.ring_bytes)}
                for (p, k), t in sorted(self.tallies().items())}


@dataclass
class TPGroup:
    """One tensor-parallel group as seen by one rank.

    `group` is None only for size 1 (no torch.distributed needed: TP=1 runs the same
    modules with every collective an identity). `device` is where this rank's tensors live.
    """

    rank: int
    size: int
    device: torch.device
    group: dist.ProcessGroup | None = None
    counter: CollectiveCounter = field(default_factory=CollectiveCounter)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ProcessGroupError(f"rank {self.rank} outside a group of {self.size}")
        if self.size > 1 and self.group is None:
            raise ProcessGroupError("a group of more than one rank needs a process group")

    def _check(self, tensor: torch.Tensor, purpose: str) -> None:
        if purpose not in PURPOSES:
            raise ProcessGroupError(f"unknown collective purpose {purpose!r}")
        if not tensor.is_contiguous():
            raise ProcessGroupError("collectives need contiguous tensors")

    def all_reduce(self, tensor: torch.Tensor, *, purpose: str) -> torch.Tensor:
        """Sum `tensor` over the group in place and return it."""
        self._check(tensor, purpose)
        if self.size == 1:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        self.counter.record(purpose, ALL_REDUCE, nbytes,
                            Fraction(2 * (self.size - 1) * nbytes, self.size))
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, *, purpose: str) -> torch.Tensor:
        """Return ``[size, *tensor.shape]``: every rank's tensor, in rank order."""
        self._check(tensor, purpose)
        if self.size == 1:
            return tensor.unsqueeze(0)
        if tensor.dim() == 0:
            raise ProcessGroupError("all_gather needs at least one dimension")
        out = torch.empty((self.size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        nbytes = tensor.numel() * tensor.element_size()
        self.counter.record(purpose, ALL_GATHER, nbytes,
                            Fraction((self.size - 1) * nbytes))
        # torch >= 2.13 names it all_gather_single (and deprecates the old name); the
        # device image's torch 2.11 only has all_gather_into_tensor.
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, tensor, group=self.group)
        return out.view(self.size, *tensor.shape)

    def broadcast(self, tensor: torch.Tensor, *, src: int, purpose: str) -> torch.Tensor:
        """Rank `src`'s `tensor` into every rank's `tensor` (in place); returns it."""
        self._check(tensor, purpose)
        if self.size == 1:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        self.counter.record(purpose, BROADCAST, nbytes,
                            Fraction((self.size - 1) * nbytes, self.size))
        dist.broadcast(tensor, src=src, group=self.group)
        return tensor
