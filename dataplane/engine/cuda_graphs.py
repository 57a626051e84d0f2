"""CUDA graphs for decode-only steps at common (padded) batch sizes and context buckets.

A graph is captured per (batch size B, context width L): it reads static buffers —
input ids, positions, KV write slots, row slots, block tables, context lengths — computes
the decode attention metadata and the LoRA row grouping on the device (the kernels
backend builds its metadata into static `LoraMetaBuffers` without a host sync) and writes
logits [B, vocab] into a static output. A decode step with D <= B rows and contexts <= L
copies its plan into the buffers, pads rows D..B-1 (token 0, KV write to the trash slot,
slot -1, context 1 at the trash slot) and replays. Adapter factor tables are updated in
place, so registering an adapter needs no recapture.

Only used on CUDA with a graph-safe LoRA backend (not the torch one, which syncs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dataplane.attention.metadata import AttentionMetadata, decode_batch, distinct_windows
from dataplane.core import BatchPlan
from dataplane.kernels import LoraMetaBuffers
from dataplane.layers.lora_linear import LoraStepContext

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MIN_CONTEXT_BUCKET = 256


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [B, vocab] float32


class CudaGraphRunner:
    """Captures and replays decode graphs for a `ModelRunner` (see module docstring)."""

    def __init__(self, runner: object, max_batch: int, max_context: int,
                 batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES) -> None:
        from dataplane.engine.model_runner import ModelRunner

        if not isinstance(runner, ModelRunner):
            raise TypeError("CudaGraphRunner needs a ModelRunner")
        self.runner = runner
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
        b, dev, i64 = self.max_batch, self.device, torch.int64
        trash = runner.cache.trash_slot
        self.input_ids = torch.zeros(b, dtype=i64, device=dev)
        self.positions = torch.zeros(b, dtype=i64, device=dev)
        self.slot_mapping = torch.full((b,), trash, dtype=i64, device=dev)
        self.row_slot = torch.full((b,), -1, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(b, self.max_blocks, dtype=i64, device=dev)
        self.context_lens = torch.ones(b, dtype=i64, device=dev)
        self.lora_buffers = (LoraMetaBuffers(b, runner.max_slots, dev)
                             if runner.max_slots > 0 else None)
        self.windows = distinct_windows(runner.config.layer_windows)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.replays = 0
        self.pool: Any = None  # the graphs' shared memory pool handle
        # Pad rows reach the trash slot (= num_blocks * bs) as position 0 of block num_blocks;
        # decode_batch clamps every key slot to the trash slot, so that block id is safe.
        self._pad_block = trash // self.block_size
        self.block_tables[:, 0] = self._pad_block

    def _forward(self, batch: int, width: int) -> torch.Tensor:
        r = self.runner
        decode = decode_batch(self.block_tables[:batch], self.context_lens[:batch],
                              self.positions[:batch], self.block_size, width, self.windows,
                              r.cache.trash_slot, gather=r.decode_kernel == "torch")
        attn = AttentionMetadata(self.positions[:batch], self.slot_mapping[:batch], (), 0,
                                 decode, r.decode_kernel)
        lora = None
        if self.lora_buffers is not None:
            meta = r.backend.build_meta(self.row_slot[:batch], self.lora_buffers)
            lora = LoraStepContext(r.backend, meta, r.workspace, skip_empty=False)
        hidden = r.model(self.input_ids[:batch], attn, r.cache, lora)
        return r.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every (batch size, context bucket) graph, largest first (shares one pool)."""
        for width in reversed(self.context_buckets):
            for batch in reversed(self.batch_sizes):
                self._capture(batch, width)

    def _capture(self, batch: int, width: int) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: Triton autotune/compile, cuBLAS handles
                self._forward(batch, width)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(batch, width)
        self.pool = graph.pool()
        self.graphs[(batch, width)] = _Graph(graph, logits)

    def _pick(self, rows: int, context: int) -> tuple[int, int] | None:
        batch = next((b for b in self.batch_sizes if b >= rows), None)
        width = next((w for w in self.context_buckets if w >= context), None)
        if batch is None or width is None or (batch, width) not in self.graphs:
            return None
        return batch, width

    def try_replay(self, plan: BatchPlan) -> torch.Tensor | None:
        """Logits [N, vocab] for a decode-only plan that fits a captured graph, else None."""
        if plan.num_prefills != 0 or plan.doff != 0:
            return None
        rows = plan.num_rows
        picked = self._pick(rows, max(plan.context_lens))
        if picked is None:
            return None
        if self.lora_buffers is None and any(s >= 0 for s in plan.row_slot):
            return None
        batch, _width = picked
        self._fill(plan, batch)
        entry = self.graphs[picked]
        entry.graph.replay()
        self.replays += 1
        order = torch.tensor(plan.sample_rows, dtype=torch.int64, device=self.device)
        return entry.logits.index_select(0, order)

    @torch.inference_mode()
    def run_padded(self, plan: BatchPlan) -> torch.Tensor:
        """The captured computation without a graph (any device): fill, pad, run eagerly.

        Lets CPU tests check the padding and device-side metadata against the eager path.
        """
        batch = next((b for b in self.batch_sizes if b >= plan.num_rows), None)
        width = next((w for w in self.context_buckets if w >= max(plan.context_lens)), None)
        if plan.num_prefills or batch is None or width is None:
            raise ValueError("plan is not a decode-only step within the graph limits")
        self._fill(plan, batch)
        logits = self._forward(batch, width)
        order = torch.tensor(plan.sample_rows, dtype=torch.int64, device=self.device)
        return logits.index_select(0, order)

    def _fill(self, plan: BatchPlan, batch: int) -> None:
        d, dev = plan.num_rows, self.device
        tables = torch.zeros(batch, self.max_blocks, dtype=torch.int64)
        tables[:, 0] = self._pad_block
        for i, table in enumerate(plan.block_tables):
            n = min(len(table), self.max_blocks)
            tables[i, :n] = torch.tensor(table[:n], dtype=torch.int64)
        pad = batch - d
        trash = self.runner.cache.trash_slot
        host = {
            "input_ids": list(plan.input_ids) + [0] * pad,
            "positions": list(plan.positions) + [0] * pad,
            "slot_mapping": list(plan.slot_mapping) + [trash] * pad,
            "context_lens": list(plan.context_lens) + [1] * pad,
        }
        for name, values in host.items():
            getattr(self, name)[:batch].copy_(torch.tensor(values, dtype=torch.int64),
                                              non_blocking=False)
        self.row_slot[:batch].copy_(torch.tensor(list(plan.row_slot) + [-1] * pad,
                                                 dtype=torch.int32))
        self.block_tables[:batch].copy_(tables.to(dev))
