"""Runs one BatchPlan through the model: plan -> device tensors -> forward -> sampled logits.

Owns the model, the paged KV cache (views of the engine's unified pool), the LoRA backend
with its per-step metadata buffers and workspace. The LoRA factors themselves live in the
pool (dataplane/engine/pool_slots.py points every projection at its address tables); the
runner allocates none. One plan per step is converted once into attention metadata and a
LoRA row grouping that every layer shares. On CUDA, decode-only steps replay captured
graphs (engine/cuda_graphs.py) and mixed steps piecewise graphs (engine/piecewise_graphs.py).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence
from functools import partial

import torch

from dataplane.attention.kv_cache import PagedKVCache
from dataplane.attention.metadata import build_attention_metadata
from dataplane.core import BatchPlan, InvalidBatchPlan, InvalidRequest, ModelInUse
from dataplane.engine.deferred import DeferredTokens, check_no_placeholders, patch_input_ids
from dataplane.h2d import to_device
from dataplane.kernels import (
    LoraMetaBuffers,
    LoraModuleWeights,
    LoraWorkspace,
    get_lora_backend,
)
from dataplane.layers.collection_table import CollectionTable
from dataplane.layers.lora_fold_slots import FoldSlots
from dataplane.layers.lora_fold_store import FoldStore
from dataplane.layers.lora_linear import LoRALinear, LoraStepContext
from dataplane.models.llama import LlamaForCausalLM


def warm_up_row_counts(max_rows: int) -> list[int]:
    """Row counts whose steps cover every kernel configuration up to `max_rows`: each
    power of two (the config tables' row buckets and the metadata build's sort widths
    are powers of two) and `max_rows` itself."""
    counts, rows = [], 1
    while rows < max_rows:
        counts.append(rows)
        rows *= 2
    return [*counts, max_rows]


_OWNERS: weakref.WeakKeyDictionary[LlamaForCausalLM, weakref.ref[ModelRunner]] = (
    weakref.WeakKeyDictionary())


def claim_model(model: LlamaForCausalLM, runner: ModelRunner) -> None:
    """Make ``runner`` the one runner of ``model``, or raise :class:`ModelInUse` (changing
    nothing) while an earlier runner of the same model object is alive: building a runner
    re-attaches the model's LoRA tables, which would leave the earlier one serving its
    eager steps without its adapters. A dropped runner still in a reference cycle is
    collected before the check."""
    owner = _OWNERS.get(model)
    if owner is not None and owner() is not None:
        gc.collect()
    if owner is not None and owner() is not None:
        raise ModelInUse("this model object already serves another live engine; build the "
                         "new engine on a model of its own or drop the old engine first")
    _OWNERS[model] = weakref.ref(runner)


PagedFold = Callable[[FoldSlots, dict[tuple[int, str], FoldStore]], None]
"""Fills the fold stores (per layer, fused projection) from the pool's pages and keeps them
in step (`ModelRunner.enable_lora_fold(paged=)`, dataplane/pool/fold_source.py)."""


class ModelRunner:
    """Executes plans. `max_slots == 0` disables LoRA entirely (base model only).

    Args:
        max_rows: largest T of any plan (max_num_batched_tokens, >= max_num_seqs).
        max_slots / max_rank: adapter slot count and the largest rank a slot may hold
            (0: no LoRA factor tables and no LoRA launches; the slots serve collection
            members only).
        lora_backend: kernels backend name (None: Triton on CUDA, torch on CPU).
        attention_backend: decode attention, "triton" (paged kernel) or "torch" (gather +
            SDPA); None: Triton on CUDA, torch on CPU.
        ops_backend: fused elementwise ops (dataplane.ops): "auto" (Triton on CUDA, torch
            on CPU), "torch" or "triton" (on CPU only under TRITON_INTERPRET=1, tests);
            None leaves the model's setting.
        kv_cache: the KV storage (page-major views of the engine's unified pool,
            `PagedKVCache.in_pages`) of exactly this model's geometry, the model's dtype and
            `num_kv_blocks` x `block_size`; None allocates a private one.

    `linears` lists the projections whose factors the engine's pool attaches.
    """

    def __init__(self, model: LlamaForCausalLM, num_kv_blocks: int, block_size: int,
                 max_rows: int, max_slots: int, max_rank: int,
                 lora_backend: str | None = None, attention_backend: str | None = None,
                 ops_backend: str | None = None, kv_cache: PagedKVCache | None = None,
                 collection_blocks: int = 0, collection_rank: int = 0) -> None:
        claim_model(model, self)
        self.model = model
        self.config = model.config
        self.device = model.embed_tokens.weight.device
        self.dtype = model.dtype
        c = self.config
        if kv_cache is not None:
            try:
                kv_cache.check_geometry(c.num_layers, num_kv_blocks, block_size,
                                        c.num_kv_heads, c.head_dim, self.dtype, self.device)
            except ValueError as exc:
                raise InvalidRequest(str(exc)) from exc
        self.cache = kv_cache if kv_cache is not None else PagedKVCache(
            c.num_layers, num_kv_blocks, block_size, c.num_kv_heads, c.head_dim, self.dtype,
            self.device)
        self.max_rows = max_rows
        self.max_slots = max_slots
        self.max_rank = max_rank
        self.decode_kernel = attention_backend or (
            "triton" if self.device.type == "cuda" else "torch")
        if self.decode_kernel not in ("torch", "triton"):
            raise InvalidRequest(f"unknown attention backend {self.decode_kernel!r}")
        self.linears: dict[tuple[int, str], LoRALinear] = {}
        self.graphs: object | None = None  # CudaGraphRunner, set by the engine on CUDA
        self.piecewise: object | None = None  # PiecewiseGraphRunner (mixed steps), likewise
        if ops_backend is not None:
            model.set_ops_backend(ops_backend)
        projections = model.lora_linears()
        if any(linear.fold is not None for _l, _a, linear in projections):
            model.lora_fold_rows = 0  # a previous runner's fold, kept in step with its tables
            model.lora_fold_slots = None
        for _layer, _attr, linear in projections:  # detach a previous runner's tables, fold
            linear.factors, linear.has_factors = None, False
            linear.fold = None
            linear.collection = None
        self.collections: dict[tuple[int, str], CollectionTable] = {}
        """Per (layer, fused projection): natively served collection members' bases and
        cores (`collection_blocks` > 0; engine/collection_slots.py fills them)."""
        if collection_blocks > 0:
            if max_slots == 0 or collection_rank <= 0 or model.tp_group is not None:
                raise InvalidRequest("collection serving needs LoRA slots, a rank > 0 and one "
                                     "device (not tensor-parallel shards)")
            for layer, attr, linear in projections:
                linear.collection = self.collections[(layer, attr)] = CollectionTable(
                    max_slots, linear.in_features, linear.out_features, collection_blocks,
                    collection_rank, self.dtype, self.device)
        if max_slots > 0 and max_rank == 0 and not self.collections:
            raise InvalidRequest("max_rank 0 holds no LoRA factors: only collection members "
                                 "(collection_blocks > 0) can use the slots")
        if max_slots > 0:
            self.backend = get_lora_backend(self.device, prefer=lora_backend)
            self.meta_buffers = LoraMetaBuffers(max_rows, max_slots, self.device)
            self.workspace = LoraWorkspace(
                self.backend.workspace_numel(max_rows, 3, max(max_rank, 1)), self.device)
            for layer, attr, linear in projections if max_rank > 0 else ():
                self.linears[(layer, attr)] = linear

    def enable_lora_fold(self, max_rows: int, width_unit: int | None = None,
                         paged: PagedFold | None = None) -> None:
        """Steps of at most `max_rows` rows (decode steps) fold the LoRA into the base GEMMs
        and their consumer ops (dataplane/ops/lora_fold.py): a fold per projection that
        `paged` (the engine's pool, dataplane/pool/fold_source.py) fills from the pool's
        pages and keeps in step. Before any adapter is loaded. `width_unit`: `FoldSlots`'
        (None: its default)."""
        if self.max_slots == 0 or max_rows <= 0 or self.max_rank == 0 or paged is None:
            raise InvalidRequest("a LoRA fold needs LoRA slots, a rank, a row limit and the "
                                 "pool's pages")
        if any(linear.has_factors for _l, _a, linear in self.model.lora_linears()):
            raise InvalidRequest("enable the LoRA fold before loading adapters")
        slots = FoldSlots(self.max_slots, min(self.max_slots, max_rows), width_unit=width_unit)
        stores = {(layer, attr): linear.enable_fold(slots.fold_slots, self.max_rank)
                  for layer, attr, linear in self.model.lora_linears()}
        paged(slots, stores)
        self.model.lora_fold_rows = max_rows
        self.model.lora_fold_slots = slots

    @property
    def graph_safe(self) -> bool:
        """True when a step can be captured in a CUDA graph (no host syncs in the LoRA path)."""
        return self.max_slots == 0 or self.backend.name != "torch"

    @torch.inference_mode()
    def warm_up_lora(self) -> int:
        """Launch every LoRA kernel variant an eager step can use, once, with no row on an
        adapter (every program exits at once), so Triton compiles them now and not in the
        middle of a served step (an 8B model's first mixed steps otherwise wait seconds
        for the JIT). Variants differ by row bucket (configs), projection shape and the
        metadata method, so one call per row count in `warm_up_row_counts` and per
        distinct projection shape covers them (no collective: the kernels only). Returns
        the number of calls made."""
        if self.max_slots == 0:
            return 0
        launchers: dict[tuple[object, ...], Callable[[LoraStepContext], None]] = {}
        for linear in self.linears.values():
            if linear.factors is not None:
                w = linear.factors.weights
                launchers.setdefault((w.in_features, tuple(w.out_features), w.max_rank),
                                     partial(_warm_up_table, w))
        calls = 0
        for rows in warm_up_row_counts(self.max_rows):
            row_slot = torch.full((rows,), -1, dtype=torch.int32, device=self.device)
            ctx = LoraStepContext(self.backend, self.backend.build_meta(row_slot,
                                                                        self.meta_buffers),
                                  self.workspace)
            for launch in launchers.values():
                launch(ctx)
                calls += 1
        return calls

    @torch.inference_mode()
    def warm_up_attention(self) -> int:
        """Launch every variant of the Triton decode-attention kernels a step can use, once
        each, on one row reading KV block 0 into a scratch output: the context-split count
        (`SPLITS`, 1 to `MAX_SPLITS`, chosen per step from its decode rows, so a run's few
        last rows pick a count its full steps never did) times the block table's width
        class (Triton specializes an integer stride on 1 and on multiples of 16) times each
        attention window of the model. Without it the first step with a new split count
        waits on the JIT. Returns the number of launches (0 on the torch decode path). The
        metadata tensors are fresh int64 ones, as eager steps build them (captured decode
        graphs compile their own variants, over their staging buffer's views, at capture)."""
        if self.decode_kernel != "triton":
            return 0
        from dataplane.attention.triton_decode import MAX_SPLITS, paged_decode_attention

        c, cache = self.config, self.cache
        q = torch.zeros((1, c.num_heads, c.head_dim), dtype=cache.k[0].dtype,
                        device=self.device)
        one = torch.ones(1, dtype=torch.int64, device=self.device)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        calls = 0
        for window in sorted(set(c.layer_windows), key=lambda w: -1 if w is None else w):
            for width in (1, 2, 16):
                tables = torch.zeros((1, width), dtype=torch.int64, device=self.device)
                splits = 1
                while splits <= MAX_SPLITS:
                    paged_decode_attention(q, cache.k[0], cache.v[0], tables, one, zero,
                                           cache.block_size, c.head_dim ** -0.5, window,
                                           splits=splits)
                    calls += 1
                    splits *= 2
        return calls

    def lora_context(self, rows: Sequence[int]) -> LoraStepContext | None:
        """Per-step row grouping of `rows` (each row's slot); None when LoRA is disabled.
        Steps of at most the model's `lora_fold_rows` rows also get their fold slots."""
        if self.max_slots == 0:
            return None
        meta = self.backend.build_meta(to_device(rows, torch.int32, self.device),
                                       self.meta_buffers)
        fold_slot, fold_width = None, 0
        slots = self.model.lora_fold_slots
        if slots is not None and len(rows) <= self.model.lora_fold_rows:
            fold_slot = to_device(slots.rows(rows), torch.int32, self.device)
            fold_width = slots.step_width
        return LoraStepContext(self.backend, meta, self.workspace, fold_slot=fold_slot,
                               fold_width=fold_width)

    def check_plan(self, plan: BatchPlan) -> None:
        if not 0 < plan.num_rows <= self.max_rows:
            raise InvalidBatchPlan(f"plan has {plan.num_rows} rows, runner allows "
                                   f"1..{self.max_rows}")
        if plan.block_size != self.cache.block_size:
            raise InvalidBatchPlan("plan block_size differs from the KV cache's")
        if max(plan.row_slot) >= self.max_slots:  # C-level scans: this runs every step
            raise InvalidBatchPlan("row slot outside the runner's slots", slots=self.max_slots)
        if min(plan.slot_mapping) < 0 or max(plan.slot_mapping) >= self.cache.num_slots:
            raise InvalidBatchPlan("KV slot outside the cache")

    @torch.inference_mode()
    def execute(self, plan: BatchPlan, deferred: DeferredTokens | None = None) -> torch.Tensor:
        """Run one step; returns float32 logits [N, vocab] for `plan.logit_rows` in order
        (the sample rows, then any prompt-logprob rows).

        `deferred` supplies the placeholder rows' input ids from a device tensor (async
        scheduling, engine/deferred.py); without it the plan must have no placeholders."""
        self.check_plan(plan)
        if deferred is None:
            check_no_placeholders(plan)
        else:
            deferred.check(plan)
        if self.graphs is not None:
            replayed = (self.graphs.try_replay(plan)  # type: ignore[attr-defined]
                        if deferred is None else
                        self.graphs.replay_plan(plan, deferred))  # type: ignore[attr-defined]
            if replayed is not None:
                return replayed
        if self.piecewise is not None:
            ran = self.piecewise.run(plan, deferred)  # type: ignore[attr-defined]
            if ran is not None:
                return ran
        device = self.device
        input_ids = to_device(plan.input_ids, torch.int64, device)
        if deferred is not None:
            patch_input_ids(input_ids, deferred)
        attn = build_attention_metadata(plan, self.config.layer_windows, device,
                                        self.cache.trash_slot, self.decode_kernel)
        lora = None
        if self.max_slots > 0 and any(s >= 0 for s in plan.row_slot):
            lora = self.lora_context(plan.row_slot)
        hidden = self.model(input_ids, attn, self.cache, lora)
        if not plan.logit_rows:
            return torch.empty(0, self.config.vocab_size, dtype=torch.float32, device=device)
        rows = to_device(plan.logit_rows, torch.int64, device)
        return self.model.compute_logits(hidden.index_select(0, rows))


def _warm_up_table(weights: LoraModuleWeights, ctx: LoraStepContext) -> None:
    """One `add_lora` on zeros over `ctx`'s rows for a runner-owned table, and for gate/up
    the expand folded into SiLU·mul (the backend skips it where it has no such path)."""
    rows = ctx.meta.num_rows
    dev, dtype = weights.storage.device, weights.storage.dtype
    x = torch.zeros(rows, weights.in_features, dtype=dtype, device=dev)
    y = torch.zeros(rows, sum(weights.out_features), dtype=dtype, device=dev)
    ctx.backend.add_lora(y, x, ctx.meta, weights, ctx.workspace)
    ctx.backend.add_lora_silu_mul(y, x, ctx.meta, weights, ctx.workspace)
