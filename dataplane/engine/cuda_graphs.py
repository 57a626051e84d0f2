"""CUDA graphs for decode-only steps at common (padded) batch sizes and context buckets.

A graph is captured per (batch size B, context width L, fold width W): it reads static
buffers —
input ids, positions, KV write slots, row slots (and fold slots, when decode steps fold the
LoRA), block tables, context lengths — computes the decode attention metadata and the
LoRA row grouping on the device (the kernels
backend builds its metadata into static `LoraMetaBuffers` without a host sync) and writes
logits [B, vocab] into a static output. A decode step with D <= B rows and contexts <= L
copies its plan into the buffers, pads rows D..B-1 (token 0, KV write to the trash slot,
slot -1, context 1 at the trash slot) and replays. Adapter factor tables are updated in
place, so registering an adapter needs no recapture. With async scheduling the plan's
placeholder rows get their input ids from the previous step's sampled tokens by a
device-to-device copy into the static input buffer after the staging upload (`deferred`).
When decode steps fold the LoRA, each batch size gets a graph per fold width
(`FoldSlots.widths`: the fold slots its GEMMs read); a step replays the one its fold
slots need (`FoldSlots.step_width`), so a step with few live adapters reads few `A` rows.
Without the fold W is 0.
`run_eagerly=True` (CPU tests) runs the captured computation eagerly instead of replaying,
so the staging, padding and deferred-id paths are exercised without CUDA.

Only used on CUDA with a graph-safe LoRA backend (not the torch one, which syncs).

Tensor parallelism: a rank's decode step is the one-GPU step plus its collectives, which
`torch.cuda.graph` records as graph nodes (the communicator exists before capture and the
warm-ups exercise it). Given the rank's `group`, the runner also (1) finishes the
warm-ups' collectives before capture and captures in thread-local error mode (the process
group's watchdog thread queries its eager work meanwhile), and (2) records each graph's
collective ledger at capture and adds it to `group.counter` on every replay, so the counts
stay exact with graphs. Every rank captures the same graphs in the same order and replays
the same one for the same plan (the fold widths follow from the plans alone).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dataplane.attention.metadata import AttentionMetadata, decode_batch, distinct_windows
from dataplane.core import BatchPlan
from dataplane.engine.deferred import DeferredTokens, patch_input_ids
from dataplane.engine.staging import Staging, stage_rows
from dataplane.h2d import to_device
from dataplane.kernels import LoraMetaBuffers
from dataplane.layers.lora_linear import LoraStepContext

if TYPE_CHECKING:
    from dataplane.parallel.collectives import CollectiveTally, TPGroup

    Ledger = dict[tuple[str, str], CollectiveTally]

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MIN_CONTEXT_BUCKET = 256
GraphKey = tuple[int, int, int]
"""(batch size, context width, fold width) of one captured decode graph."""



@contextmanager
def no_collection() -> Iterator[None]:
    """Python's cyclic GC off while a graph is captured. A dropped engine's graphs wait in
    reference cycles; collected mid-capture, their `CUDAGraph.reset` is an operation the
    capturing stream does not permit, and the capture fails ("operation failed due to a
    previous error during capture"). `torch.cuda.graph` collects once before it starts."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [B, vocab] float32


class CudaGraphRunner:
    """Captures and replays decode graphs for a `ModelRunner` (see module docstring)."""

    def __init__(self, runner: object, max_batch: int, max_context: int,
                 batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
                 run_eagerly: bool = False, group: TPGroup | None = None) -> None:
        from dataplane.engine.model_runner import ModelRunner

        if not isinstance(runner, ModelRunner):
            raise TypeError("CudaGraphRunner needs a ModelRunner")
        self.runner = runner
        self.group = group
        self.ledgers: dict[GraphKey, Ledger] = {}
        """A TP rank's collectives of each captured graph (module docstring)."""
        self.run_eagerly = run_eagerly
        self.device = runner.device
        self.block_size = runner.cache.block_size
        self.batch_sizes = tuple(sorted({b for b in batch_sizes if b < max_batch} | {max_batch}))
        self.max_batch = self.batch_sizes[-1]
        # The Triton decode kernel reads context lengths on the device: one width serves
        # all; the torch gather path pads to the width, so it gets doubling buckets.
        buckets, width = [], MIN_CONTEXT_BUCKET
        while width < max_context and runner.decode_kernel == "torch":
            buckets.append(width)
            width *= 2
        buckets.append(max_context)
        self.context_buckets = tuple(buckets)
        self.max_blocks = (max_context + self.block_size - 1) // self.block_size
        b, dev = self.max_batch, self.device
        trash = runner.cache.trash_slot
        # All int64 inputs live in one device buffer (one H2D copy per step) staged from a
        # pinned host mirror filled through numpy:
        #   [input_ids B | positions B | slot_mapping B | context_lens B | block_tables B x M]
        m = self.max_blocks
        self._staged = Staging(4 * b + b * m, torch.int64, dev)
        self._staged_slots = Staging(2 * b, torch.int32, dev)  # [row slots B | fold slots B]
        flat = self._staged.device
        self.input_ids = flat[0:b]
        self.positions = flat[b:2 * b]
        self.slot_mapping = flat[2 * b:3 * b]
        self.context_lens = flat[3 * b:4 * b]
        self.block_tables = flat[4 * b:].view(b, m)
        self.row_slot = self._staged_slots.device[:b]
        self.fold_slot = self._staged_slots.device[b:]
        host = self._staged.array
        self._host_ids, self._host_pos = host[0:b], host[b:2 * b]
        self._host_slots, self._host_ctx = host[2 * b:3 * b], host[3 * b:4 * b]
        self._host_tables = host[4 * b:].reshape(b, m)
        self._host_row_slot = self._staged_slots.array[:b]
        self._host_fold_slot = self._staged_slots.array[b:]
        self._table_rows: list[tuple[int, ...] | None] = [None] * b
        """The block table last staged in each row (rows are re-staged only on change)."""
        self._identity = {n: tuple(range(n)) for n in range(b + 1)}
        self.lora_buffers = (LoraMetaBuffers(b, runner.max_slots, dev)
                             if runner.max_slots > 0 else None)
        self.windows = distinct_windows(runner.config.layer_windows)
        self.graphs: dict[GraphKey, _Graph] = {}
        self.replays = 0
        self.last_key: GraphKey | None = None
        """The graph the last `replay_plan` replayed (None: it returned None)."""
        self.pool: Any = None  # the graphs' shared memory pool handle
        # Pad rows reach the trash slot (= num_blocks * bs) as position 0 of block num_blocks;
        # decode_batch clamps every key slot to the trash slot, so that block id is safe.
        self._pad_block = trash // self.block_size
        self._trash = trash
        host[:] = 0
        self._host_slots[:] = trash
        self._host_ctx[:] = 1
        self._host_tables[:, 0] = self._pad_block
        self._staged_slots.array[:] = -1
        self._staged.upload(len(host))
        self._staged_slots.upload(2 * b)

    def _folds(self, batch: int) -> bool:
        model = self.runner.model
        return model.lora_fold_slots is not None and batch <= model.lora_fold_rows

    def fold_widths(self, batch: int) -> tuple[int, ...]:
        """The fold widths a `batch`-row graph is captured for ((0,) without the fold)."""
        slots = self.runner.model.lora_fold_slots
        return slots.widths if slots is not None and self._folds(batch) else (0,)

    def _forward(self, batch: int, width: int, fold_width: int = 0) -> torch.Tensor:
        r = self.runner
        decode = decode_batch(self.block_tables[:batch], self.context_lens[:batch],
                              self.positions[:batch], self.block_size, width, self.windows,
                              r.cache.trash_slot, gather=r.decode_kernel == "torch")
        attn = AttentionMetadata(self.positions[:batch], self.slot_mapping[:batch], (), 0,
                                 decode, r.decode_kernel)
        lora = None
        if self.lora_buffers is not None:
            meta = r.backend.build_meta(self.row_slot[:batch], self.lora_buffers)
            folds = self._folds(batch)
            lora = LoraStepContext(r.backend, meta, r.workspace, skip_empty=False,
                                   fold_slot=self.fold_slot[:batch] if folds else None,
                                   fold_width=fold_width if folds else 0)
        hidden = r.model(self.input_ids[:batch], attn, r.cache, lora)
        return r.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every (batch size, context bucket, fold width) graph, largest first
        (they share one pool)."""
        for width in reversed(self.context_buckets):
            for batch in reversed(self.batch_sizes):
                for fold_width in reversed(self.fold_widths(batch)):
                    self._capture((batch, width, fold_width))

    def _capture(self, key: GraphKey) -> None:
        counter = None if self.group is None else self.group.counter
        before = None if counter is None else counter.tallies()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: Triton autotune/compile, cuBLAS (and NCCL) paths
                self._forward(*key)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        options: dict[str, Any] = {}
        if counter is not None:
            torch.cuda.synchronize(self.device)  # the warm-ups' collectives are done
            counter.reset()
            options["capture_error_mode"] = "thread_local"
        graph = torch.cuda.CUDAGraph()
        with no_collection(), torch.cuda.graph(graph, pool=self.pool, **options):
            logits = self._forward(*key)
        self.pool = graph.pool()
        self.graphs[key] = _Graph(graph, logits)
        if counter is not None and before is not None:
            self.ledgers[key] = counter.tallies()  # the one captured forward's
            counter.reset()
            counter.add(before)

    def release(self) -> None:
        """Drop every captured graph (later steps run eagerly). A TP rank calls this before
        leaving its NCCL group: destroying a communicator that a live graph captured hangs
        (pytorch/pytorch#115388)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for entry in self.graphs.values():
            entry.graph.reset()
        self.graphs.clear()

    def _pick(self, rows: int, context: int) -> tuple[int, int] | None:
        batch = next((b for b in self.batch_sizes if b >= rows), None)
        width = next((w for w in self.context_buckets if w >= context), None)
        if batch is None or width is None or (
                (batch, width, self.fold_widths(batch)[-1]) not in self.graphs
                and not self.run_eagerly):
            return None
        return batch, width

    def _fold_rows(self, plan: BatchPlan, batch: int) -> tuple[list[int], int] | None:
        """The plan's fold slots and fold width when a `batch`-row step folds (copying the
        adapters the fold lacks in first), else None."""
        slots = self.runner.model.lora_fold_slots
        if slots is None or not self._folds(batch):
            return None
        rows = slots.rows(plan.row_slot)
        return rows, slots.step_width

    def try_replay(self, plan: BatchPlan) -> torch.Tensor | None:
        """`replay_plan(plan, None)`: a plan whose input ids are all on the host."""
        return self.replay_plan(plan, None)

    def replay_plan(self, plan: BatchPlan, deferred: DeferredTokens | None
                    ) -> torch.Tensor | None:
        """Logits [N, vocab] for a decode-only plan that fits a captured graph, else None.

        Host work: O(rows) numpy fills of pinned staging buffers, two non-blocking H2D
        copies, the deferred input-id copy (if any), one graph launch; no device sync. For a
        decode-only plan the sample rows are the rows in order, so the result is a view of
        the graph's logits (valid until the next replay)."""
        if plan.doff != 0 or len(plan.prefill_indptr) != 1:
            return None
        rows = plan.num_rows
        picked = self._pick(rows, max(plan.context_lens))
        if picked is None:
            return None
        self.last_key = None
        if self.lora_buffers is None and max(plan.row_slot) >= 0:
            return None
        batch, width = picked
        fold = self._fold_rows(plan, batch)
        key = (batch, width, 0 if fold is None else fold[1])
        if key not in self.graphs and not self.run_eagerly:
            return None
        self._fill(plan, batch, fold)
        if deferred is not None:
            patch_input_ids(self.input_ids, deferred)
        self.replays += 1
        self.last_key = key
        if self.run_eagerly:
            with torch.inference_mode():
                return self._sampled(self._forward(*key), plan)
        entry = self.graphs[key]
        entry.graph.replay()
        if self.group is not None and key in self.ledgers:
            self.group.counter.add(self.ledgers[key])
        return self._sampled(entry.logits, plan)

    def _sampled(self, logits: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
        if plan.sample_rows == self._identity[plan.num_rows]:
            return logits[:plan.num_rows]
        order = to_device(plan.sample_rows, torch.int64, self.device)
        return logits.index_select(0, order)

    @torch.inference_mode()
    def run_padded(self, plan: BatchPlan) -> torch.Tensor:
        """The captured computation without a graph (any device): fill, pad, run eagerly.

        Lets CPU tests check the padding and device-side metadata against the eager path.
        """
        batch = next((b for b in self.batch_sizes if b >= plan.num_rows), None)
        width = next((w for w in self.context_buckets if w >= max(plan.context_lens)), None)
        if plan.num_prefills or batch is None or width is None:
            raise ValueError("plan is not a decode-only step within the graph limits")
        fold = self._fold_rows(plan, batch)
        self._fill(plan, batch, fold)
        return self._sampled(self._forward(batch, width, 0 if fold is None else fold[1]),
                             plan).clone()

    def _fill(self, plan: BatchPlan, batch: int, fold: tuple[list[int], int] | None
              ) -> None:
        """Stage the plan's D rows and pad rows D..batch-1 (token 0, KV write to the trash
        slot, slot -1, context 1 in the pad block), then copy to the device buffers; `fold`: the
        rows' fold slots and the fold width (`_fold_rows`), or None.

        Block-table entries beyond a row's context are never read (the Triton kernel stops
        at context_lens; the torch gather masks them and clamps slots), so a row is
        re-staged only when its table changed and stale tails are left in place."""
        d = plan.num_rows
        self._staged.wait()
        self._staged_slots.wait()
        stage_rows(plan, batch, self._trash, self._host_ids, self._host_pos, self._host_slots,
                   self._host_row_slot)
        self._host_ctx[:d] = plan.context_lens
        if batch > d:
            self._host_ctx[d:batch] = 1
            self._host_tables[d:batch, 0] = self._pad_block
            for i in range(d, batch):
                self._table_rows[i] = None
        tables, staged, host_tables, m = (plan.block_tables, self._table_rows,
                                          self._host_tables, self.max_blocks)
        for i in range(d):
            table = tables[i]
            if staged[i] != table:
                n = min(len(table), m)
                host_tables[i, :n] = table[:n]
                staged[i] = table
        self._staged.upload(len(self._staged.array))
        if fold is None:
            self._staged_slots.upload(batch)
            return
        self._host_fold_slot[:d] = fold[0]
        self._host_fold_slot[d:batch] = -1
        self._staged_slots.upload(self.max_batch + batch)
