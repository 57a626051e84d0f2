"""Piecewise CUDA graphs for tensor-parallel mixed (prefill + decode) steps.

A TP rank's mixed step is the single-GPU step plus its collectives (o and down
all-reduces in every layer, the embedding's all-reduce; the LM head's all-gather runs
eagerly after the pieces), so the engine's `PiecewiseGraphRunner` captures it unchanged:
the collectives issued inside a piece become graph nodes, as in `tp_graphs` for decode
steps. Attention between pieces is local (KV heads are sharded), so it stays eager.

What a rank adds (the same three things `TPCudaGraphRunner` adds to decode graphs):
    * the warm-ups' collectives finish before capture (device synchronize), and capture
      uses thread-local error mode (the process group's watchdog thread may query its
      eager work events meanwhile);
    * each bucket's ledger (calls, payload and ring bytes of its pieces) is recorded at
      capture and added to `group.counter` on every replay; warm-ups are not counted;
    * `release()` before the group is destroyed.

Lockstep: every rank captures the same buckets in the same order (same `max_rows`) and
gets the same plan each step, so every rank replays the same bucket or, where none fits,
runs the eager path.
"""

from __future__ import annotations

from typing import Any

import torch

from dataplane.engine.piecewise_graphs import PiecewiseGraphRunner
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.tp_graphs import Ledger


class TPPiecewiseGraphRunner(PiecewiseGraphRunner):
    """`PiecewiseGraphRunner` over a TP rank's model, its replayed collectives counted.

    Args:
        runner: the rank's `ModelRunner` (model = `TPLlamaForCausalLM`).
        group: the rank's `TPGroup` (its counter receives the replayed ledgers).
        max_rows / min_rows / buckets / run_eagerly: as `PiecewiseGraphRunner`.
    """

    def __init__(self, runner: object, group: TPGroup, max_rows: int, min_rows: int = 1,
                 buckets: tuple[int, ...] | None = None, run_eagerly: bool = False) -> None:
        super().__init__(runner, max_rows, min_rows, buckets, run_eagerly)
        self.group = group
        self.ledgers: dict[int, Ledger] = {}

    def _capture(self, rows: int) -> None:
        counter = self.group.counter
        before = counter.tallies()
        try:
            super()._capture(rows)
        finally:
            counter.reset()
            counter.add(before)

    def _before_capture(self, rows: int) -> None:
        torch.cuda.synchronize(self.device)  # CUDA-only: the warm-ups' collectives are done
        self.group.counter.reset()

    def _capture_options(self) -> dict[str, Any]:
        return {"capture_error_mode": "thread_local"}

    def _after_capture(self, rows: int) -> None:
        self.ledgers[rows] = self.group.counter.tallies()

    def _replayed(self, rows: int) -> None:
        self.group.counter.add(self.ledgers[rows])


def attach_tp_piecewise(runner: object, group: TPGroup, max_rows: int,
                        buckets: tuple[int, ...] | None = None) -> TPPiecewiseGraphRunner:
    """Capture a rank's piecewise graphs of mixed steps up to `max_rows` rows (CUDA only)
    and install them on `runner`. Every rank of the group calls this with the same sizes
    at the same point (the captures run collectives)."""
    from dataplane.engine.model_runner import ModelRunner

    if not isinstance(runner, ModelRunner):
        raise TypeError("attach_tp_piecewise needs a ModelRunner")
    if runner.device.type != "cuda":  # CUDA-only from here on
        raise RuntimeError("CUDA graphs need a CUDA device")
    pieces = TPPiecewiseGraphRunner(runner, group, max_rows, buckets=buckets)
    pieces.capture_all()
    runner.piecewise = pieces
    return pieces
