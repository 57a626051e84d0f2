"""CUDA graphs for tensor-parallel decode steps (the engine's `CudaGraphRunner`, counted).

A TP rank's decode step is the single-GPU decode step plus its collectives, so the
engine's `CudaGraphRunner` captures it unchanged: `torch.cuda.graph` captures on its own
side stream, and NCCL collectives issued through the same process group during capture
become graph nodes (NCCL >= 2.9.6; the communicator is created eagerly by
`init_tp_group(device_id=...)` and exercised by the warm-up forwards, so capture makes no
NCCL setup call). Replay then costs one host launch per step instead of hundreds.

Lockstep contract (what keeps the ranks' collectives matched):
    * every rank captures the same (batch, width, fold width) graphs in the same order
      (`capture_all` is deterministic given the same sizes), and
    * every rank gets the same plan each step, so `replay_plan` picks the same graph, or
      falls back to the eager path, on every rank (the fold's choices, and so the fold
      width, follow from the plans alone).

What this adds to `CudaGraphRunner`: replay issues the captured collectives without
running the `TPGroup` wrappers, so the per-graph ledger (calls, payload and ring bytes of
the one captured forward) is recorded at capture and added to `group.counter` on every
replay — counts per step stay exact with graphs. Warm-up forwards are not left in the
counter. CPU tests exercise everything but the CUDA graph itself through `run_padded`
(the captured computation, eagerly, over gloo).
"""

from __future__ import annotations

import torch

from dataplane.core import BatchPlan
from dataplane.engine.cuda_graphs import (
    DEFAULT_BATCH_SIZES,
    CudaGraphRunner,
    GraphKey,
    _Graph,
    no_collection,
)
from dataplane.engine.deferred import DeferredTokens
from dataplane.parallel.collectives import CollectiveTally, TPGroup

Ledger = dict[tuple[str, str], CollectiveTally]


class TPCudaGraphRunner(CudaGraphRunner):
    """`CudaGraphRunner` over a TP model whose per-graph collectives are counted.

    Args:
        runner: the rank's `ModelRunner` (model = `TPLlamaForCausalLM`).
        group: the rank's `TPGroup` (its counter receives the replayed ledgers).
        max_batch / max_context / batch_sizes: as `CudaGraphRunner`.
    """

    def __init__(self, runner: object, group: TPGroup, max_batch: int, max_context: int,
                 batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES) -> None:
        super().__init__(runner, max_batch, max_context, batch_sizes)
        self.group = group
        self.ledgers: dict[GraphKey, Ledger] = {}
        self._captured: Ledger | None = None

    def _forward(self, batch: int, width: int, fold_width: int = 0) -> torch.Tensor:
        # CUDA-only branch: only the forward inside `torch.cuda.graph` is recorded.
        if self.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            return super()._forward(batch, width, fold_width)
        counter = self.group.counter
        before = counter.tallies()
        counter.reset()
        logits = super()._forward(batch, width, fold_width)
        self._captured = counter.tallies()
        counter.reset()
        counter.add(before)
        return logits

    def _capture(self, key: GraphKey) -> None:
        # CUDA-only. `CudaGraphRunner._capture` plus two things a TP rank needs: the
        # warm-ups' collectives finish before capture (synchronize), and capture uses
        # thread-local error mode, so the process group's watchdog thread querying its
        # (eager) work events cannot invalidate the capture. The counter is left as it
        # was; the captured forward's ledger is kept for replays.
        counter = self.group.counter
        before = counter.tallies()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: Triton autotune/compile, cuBLAS and NCCL paths
                self._forward(*key)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self._captured = None
        graph = torch.cuda.CUDAGraph()
        with no_collection(), torch.cuda.graph(graph, pool=self.pool,
                                               capture_error_mode="thread_local"):
            logits = self._forward(*key)
        self.pool = graph.pool()
        self.graphs[key] = _Graph(graph, logits)
        counter.reset()
        counter.add(before)
        if self._captured is None:
            raise RuntimeError("graph captured without a recorded forward")
        self.ledgers[key] = self._captured

    def replay_plan(self, plan: BatchPlan, deferred: DeferredTokens | None
                    ) -> torch.Tensor | None:
        """`CudaGraphRunner.replay_plan`, plus the replayed graph's collectives counted."""
        logits = super().replay_plan(plan, deferred)
        if logits is not None and self.last_key in self.ledgers:
            self.group.counter.add(self.ledgers[self.last_key])
        return logits


def attach_tp_graphs(runner: object, group: TPGroup, max_batch: int, max_context: int,
                     batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
                     ) -> TPCudaGraphRunner:
    """Capture a rank's decode graphs (CUDA only) and install them on `runner`.

    Every rank of the group must call this with the same sizes at the same point (the
    captures run collectives). Replaces any graphs the runner had.
    """
    from dataplane.engine.model_runner import ModelRunner

    if not isinstance(runner, ModelRunner):
        raise TypeError("attach_tp_graphs needs a ModelRunner")
    if runner.device.type != "cuda":  # CUDA-only from here on
        raise RuntimeError("CUDA graphs need a CUDA device")
    graphs = TPCudaGraphRunner(runner, group, max_batch, max_context, batch_sizes)
    graphs.capture_all()
    runner.graphs = graphs
    return graphs
