"""CUDA graphs for mixed (prefill + decode) steps, piecewise around attention.

An eager 8B step launches ~20 kernels per layer (~30 with LoRA), each costing tens of µs
of host time, so a step of a few hundred rows waits on the host. Here the layers' work
between attention calls is captured, per row bucket, as L + 1 graphs ("pieces"): piece 0 =
embeddings, RoPE tables, the LoRA row grouping and layer 0 up to its fused RoPE + KV
write; piece k = layer k-1 after attention (o, add-norm, gate/up, down, all with LoRA) and
layer k up to its KV write; piece L = the last layer after attention. Each piece copies
its layer's q (and k/v where the torch attention path reads fresh keys) into static
buffers; attention runs eagerly between pieces, on the real rows only, with the step's own
metadata (prefill tiles and decode block tables change every step), writing into one
static output buffer the next piece reads. A piece's other outputs (the residual stream)
are read only by the next piece, so later pieces may reuse their memory.

A plan with T rows takes the smallest bucket B >= T: its ids, positions, KV write slots
and row slots are staged into static buffers and rows T..B-1 padded (token 0, position 0,
the trash KV slot, slot -1: no LoRA work, no KV write anyone reads). Every row-wise op
computes pad rows too and nobody reads them. Pieces of all buckets share one memory pool
(captured largest first; a bucket's pieces replay in capture order). Adapter tables are
updated in place, so registering an adapter needs no recapture.

`run_eagerly=True` (CPU tests) runs the pieces as plain calls on the same buffers, so the
split, the staging and the padding are checked against the eager path without CUDA.

Tensor parallelism: a rank's mixed step is the one-GPU step plus its collectives (the o
and down all-reduces, the embedding's; the LM head's all-gather runs eagerly after the
pieces), captured inside the pieces as in `CudaGraphRunner`; attention between pieces is
local (KV heads are sharded). Given the rank's `group`, the warm-ups' collectives finish
before capture, pieces capture in thread-local error mode, and each bucket's ledger is
added to `group.counter` on every replay. Every rank captures the same buckets in the same
order and gets the same plan, so every rank replays the same bucket or none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dataplane.attention.metadata import build_attention_metadata
from dataplane.attention.paged_attention import paged_attention
from dataplane.core import BatchPlan
from dataplane.engine.cuda_graphs import no_collection
from dataplane.engine.deferred import DeferredTokens, patch_input_ids
from dataplane.engine.staging import Staging, stage_rows
from dataplane.h2d import to_device
from dataplane.kernels import LoraMetaBuffers
from dataplane.layers.lora_linear import LoraStepContext
from dataplane.models.llama import DecoderLayer

if TYPE_CHECKING:
    from dataplane.parallel.collectives import CollectiveTally, TPGroup


def row_buckets(min_rows: int, max_rows: int, step: int = 64, wide_step: int = 256,
                wide_from: int = 1024) -> tuple[int, ...]:
    """Buckets from the first multiple of `step` >= `min_rows` to `max_rows`: every
    `step` rows up to `wide_from`, every `wide_step` above (padding stays under ~25%
    there), and `max_rows` itself."""
    if min_rows < 1 or max_rows < min_rows:
        raise ValueError("need 1 <= min_rows <= max_rows")
    out, rows = [], -(-min_rows // step) * step
    while rows < max_rows:
        out.append(rows)
        rows += step if rows < wide_from else wide_step
    return (*out, max_rows)


@dataclass
class _Bucket:
    graphs: list[Any] = field(default_factory=list)  # one torch.cuda.CUDAGraph per piece
    io: dict[str, Any] = field(default_factory=dict)  # the last piece outputs (static)


class PiecewiseGraphRunner:
    """Captures and replays piecewise graphs of mixed steps for a `ModelRunner`."""

    def __init__(self, runner: object, max_rows: int, min_rows: int = 1,
                 buckets: tuple[int, ...] | None = None, run_eagerly: bool = False,
                 group: TPGroup | None = None) -> None:
        from dataplane.engine.model_runner import ModelRunner

        if not isinstance(runner, ModelRunner):
            raise TypeError("PiecewiseGraphRunner needs a ModelRunner")
        self.runner = runner
        self.group = group
        self.ledgers: dict[int, dict[tuple[str, str], CollectiveTally]] = {}
        """A TP rank's collectives of each captured bucket's pieces (module docstring)."""
        self.run_eagerly = run_eagerly
        self.device = runner.device
        self.buckets = buckets or row_buckets(min_rows, max_rows)
        b, dev, c = self.buckets[-1], self.device, runner.config
        self._staged = Staging(3 * b, torch.int64, dev)  # ids | positions | KV slots
        self._staged_slots = Staging(b, torch.int32, dev)
        flat = self._staged.device
        self.input_ids, self.positions, self.slot_mapping = flat[:b], flat[b:2 * b], flat[2 * b:]
        self.row_slot = self._staged_slots.device
        host = self._staged.array
        self._host_ids, self._host_pos, self._host_slots = host[:b], host[b:2 * b], host[2 * b:]
        self._host_row_slot = self._staged_slots.array
        self._trash = runner.cache.trash_slot
        self._host_slots[:] = self._trash
        self._host_row_slot[:] = -1
        self._staged.upload(3 * b)
        self._staged_slots.upload(b)
        self.attn_out = torch.zeros(b, c.num_heads, c.head_dim, dtype=runner.dtype, device=dev)
        self.q_buf = torch.zeros_like(self.attn_out)
        self.fresh_kv = runner.decode_kernel != "triton"  # torch prefill reads fresh k/v
        kv_rows = b if self.fresh_kv else 0
        self.k_buf = torch.zeros(kv_rows, c.num_kv_heads, c.head_dim, dtype=runner.dtype,
                                 device=dev)
        self.v_buf = torch.zeros_like(self.k_buf)
        self.lora_buffers = (LoraMetaBuffers(b, runner.max_slots, dev)
                             if runner.max_slots > 0 else None)
        self.layers: list[DecoderLayer] = list(runner.model.layers)  # type: ignore[arg-type]
        self.captured: dict[int, _Bucket] = {}
        self.pool: Any = None
        self.runs = 0

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    def _piece(self, rows: int, k: int, io: dict[str, Any]) -> None:
        """Piece `k` of a `rows`-row bucket: reads the static buffers and `io` (the
        previous piece's outputs), leaves its own outputs in `io`."""
        r = self.runner
        model = r.model
        if k == 0:
            h, residual = model.embed_tokens(self.input_ids[:rows]), None
            io["cos_sin"] = model.rotary.cos_sin(self.positions[:rows], model.dtype)
            io["lora"] = None
            if self.lora_buffers is not None:
                meta = r.backend.build_meta(self.row_slot[:rows], self.lora_buffers)
                io["lora"] = LoraStepContext(r.backend, meta, r.workspace, skip_empty=False)
        else:
            h, residual = self.layers[k - 1].post_attention(self.attn_out[:rows],
                                                            io["residual"], io["lora"])
        if k == len(self.layers):
            io["hidden"] = h if residual is None else h + residual
            return
        q, key, value, io["residual"] = self.layers[k].pre_attention(
            h, residual, io["cos_sin"], self.slot_mapping[:rows], r.cache, io["lora"])
        self.q_buf[:rows].copy_(q)
        if self.fresh_kv:
            self.k_buf[:rows].copy_(key)
            self.v_buf[:rows].copy_(value)

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every bucket's pieces, largest bucket first (one shared pool)."""
        for rows in reversed(self.buckets):
            self._capture(rows)

    def _capture(self, rows: int) -> None:
        counter = None if self.group is None else self.group.counter
        before = None if counter is None else counter.tallies()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: Triton compiles, cuBLAS handles, LoRA plans
                warm: dict[str, Any] = {}
                for k in range(self.num_pieces):
                    self._piece(rows, k, warm)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        options: dict[str, Any] = {}
        if counter is not None:  # a TP rank (module docstring)
            torch.cuda.synchronize(self.device)
            counter.reset()
            options["capture_error_mode"] = "thread_local"
        bucket = _Bucket()
        for k in range(self.num_pieces):
            graph = torch.cuda.CUDAGraph()
            with no_collection(), torch.cuda.graph(graph, pool=self.pool, **options):
                self._piece(rows, k, bucket.io)
            self.pool = graph.pool()
            bucket.graphs.append(graph)
        self.captured[rows] = bucket
        if counter is not None and before is not None:
            self.ledgers[rows] = counter.tallies()
            counter.reset()
            counter.add(before)

    def release(self) -> None:
        """Drop every captured piece (later mixed steps run eagerly). A TP rank calls this
        before leaving its NCCL group (pieces capture its collectives, see
        `CudaGraphRunner.release`)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for bucket in self.captured.values():
            for graph in bucket.graphs:
                graph.reset()
        self.captured.clear()

    def run(self, plan: BatchPlan, deferred: DeferredTokens | None) -> torch.Tensor | None:
        """Float32 logits [N, vocab] for `plan.logit_rows`, or None when no bucket fits
        (or the bucket is not captured and not running eagerly). Host work: the staging
        fills, two non-blocking copies, per layer one graph launch and the attention
        launches; no device sync."""
        rows = plan.num_rows
        bucket_rows = next((b for b in self.buckets if b >= rows), None)
        if bucket_rows is None:
            return None
        bucket = self.captured.get(bucket_rows)
        if bucket is None and not self.run_eagerly:
            return None
        if self.lora_buffers is None and max(plan.row_slot) >= 0:
            return None
        r = self.runner
        self._fill(plan, bucket_rows)
        if deferred is not None:
            patch_input_ids(self.input_ids, deferred)
        attn = build_attention_metadata(plan, r.config.layer_windows, self.device,
                                        r.cache.trash_slot, r.decode_kernel)
        io: dict[str, Any] = {} if bucket is None else bucket.io
        self.runs += 1
        with torch.inference_mode():
            for k in range(self.num_pieces):
                if bucket is None:
                    self._piece(bucket_rows, k, io)
                else:
                    bucket.graphs[k].replay()
                if k < self.num_pieces - 1:
                    layer = self.layers[k]
                    paged_attention(self.q_buf[:rows], self.k_buf[:rows], self.v_buf[:rows],
                                    layer.index, r.cache, attn, layer.window, layer.scale,
                                    write_kv=False, out=self.attn_out[:rows])
            if bucket is not None and self.group is not None and bucket_rows in self.ledgers:
                self.group.counter.add(self.ledgers[bucket_rows])
            if not plan.logit_rows:
                return torch.empty(0, r.config.vocab_size, dtype=torch.float32,
                                   device=self.device)
            picked = to_device(plan.logit_rows, torch.int64, self.device)
            return r.model.compute_logits(io["hidden"].index_select(0, picked))

    def _fill(self, plan: BatchPlan, bucket_rows: int) -> None:
        self._staged.wait()
        self._staged_slots.wait()
        stage_rows(plan, bucket_rows, self._trash, self._host_ids, self._host_pos,
                   self._host_slots, self._host_row_slot)
        b = self.buckets[-1]
        self._staged.upload(3 * b)
        self._staged_slots.upload(bucket_rows)
