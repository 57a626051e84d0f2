"""The public multi-adapter `Engine`: load adapters, add requests, step, generate.

One step = scheduler.schedule() -> build_batch_plan -> ModelRunner.execute (logits of the
sampled rows) -> Sampler -> scheduler.postprocess (docs/ARCHITECTURE.md, "The step"); the
stepping lives in engine/step_loop.py. With async scheduling (engine/async_steps.py) the next
step is launched before this one's tokens reach the host, so host work hides behind the
device. Adapter factors and KV blocks live in one unified page pool
(engine/pool_slots.py); requests bind to an adapter by handle, and the scheduler gives model
rows only to requests whose adapter slot is published. Build engines with
`dataplane.engine.build_engine` (engine/builder.py). A tensor-parallel rank is this same
engine over its shard of the model (`model.tp_group` set): rank 0 leads, the others
`serve()` (engine/lockstep.py).

Usage::

    engine = build_engine(EngineSpec.of(model_dir, max_slots=4))
    h = engine.register_adapter(peft_dir)
    outs = engine.generate([[1, 2, 3], "hello"], SamplingParams(temperature=0), [h, None])
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from collections.abc import Sequence as SequenceOf
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import cast

import torch

from dataplane.artifacts import BaseModelABI
from dataplane.collections.bundle import CollectionBundle
from dataplane.collections.errors import CollectionError
from dataplane.core import (
    BatchPlan,
    EngineError,
    InvalidRequest,
    InvalidSamplingParams,
    SamplingParams,
    Sequence,
    build_batch_plan,
)
from dataplane.engine.activation import ALWAYS_ON, AloraNotInvoked, activation_offset
from dataplane.engine.adapters import (
    AdapterError,
    AdapterHandle,
    AdapterRegistry,
    LoadedAdapter,
    Placed,
    load_peft_adapter,
)
from dataplane.engine.async_steps import Launched, has_live_rows
from dataplane.engine.collection_slots import CollectionHandle, CollectionRegistry
from dataplane.engine.config import EngineConfig
from dataplane.engine.deferred import DeferredTokens
from dataplane.engine.lockstep import Lockstep
from dataplane.engine.model_runner import ModelRunner
from dataplane.engine.observer import EngineObserver
from dataplane.engine.pool_slots import PoolSlots
from dataplane.engine.request_output import RequestOutput
from dataplane.engine.scheduler import ScheduleOutput, Scheduler, SchedulerConfig
from dataplane.engine.step_loop import StepLoop
from dataplane.kvcache import BlockManager, CacheABI
from dataplane.models.llama import LlamaForCausalLM
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.errors import ProcessGroupError
from dataplane.pool.errors import StaleGeneration
from dataplane.pool.faults import FaultInjector
from dataplane.pool.slot_table import LaunchSnapshot
from dataplane.sampling.grammar import GrammarCompiler, GrammarState
from dataplane.sampling.sampler import Sampler, TokenLogprobs
from dataplane.tokenizer import Tokenizer

__all__ = ["Engine", "EngineConfig", "EngineStalled", "RequestOutput"]


class EngineStalled(EngineError):
    """generate() found queued requests that no step can schedule (nothing would change)."""

    code = "ENGINE_STALLED"


class Engine(StepLoop):
    """Continuous-batching multi-LoRA engine over one Llama-family base model.

    Stepping (`step`) comes from `StepLoop`; this class holds construction, adapters and
    requests. Observers (`observers`, engine/observer.py) hear each launched plan and the
    pool's evictions."""

    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, base_digest: str,
                 base_abi: BaseModelABI | None = None, tokenizer: Tokenizer | None = None,
                 *, faults: FaultInjector | None = None) -> None:
        """`base_digest` is H_base (keys the prefix cache); `base_abi` validates PEFT dirs
        (None: only pre-loaded adapters via `register_loaded_adapter`). The unified pool
        has `num_kv_blocks` pages for KV blocks and adapter factors; `faults` injects
        failures into its load transactions (tests); `config.host_tier_bytes` caps its
        host tier.

        A tensor-parallel rank's model (`model.tp_group` set, dataplane/parallel/
        shard_model.py) keeps its shard of every adapter in its own pool; the ranks run in
        lockstep (`lockstep`)."""
        self.config = config
        self.base_abi = base_abi
        self.model = model
        self.tokenizer = tokenizer
        mc = model.config
        max_len = config.max_model_len or mc.max_position_embeddings
        self.max_model_len = max_len
        group = model.tp_group
        if group is not None and config.collection_blocks:
            raise InvalidRequest("collection serving needs one device (the collection "
                                 "tables are not sharded)")
        lora_slots = config.max_slots if config.max_rank > 0 else 0
        member_slots = config.max_slots if config.collection_blocks else 0
        self.pool = PoolSlots.for_model(
            model, num_pages=config.num_kv_blocks, block_size=config.block_size,
            max_slots=lora_slots, max_rank=config.max_rank, faults=faults,
            member_slots=member_slots, host_bytes=config.host_tier_bytes)
        """KV blocks and adapter factors in one device buffer (engine/pool_slots.py)."""
        self.runner = ModelRunner(model, config.num_kv_blocks, config.block_size,
                                  max_rows=max(config.max_num_batched_tokens, config.max_num_seqs),
                                  max_slots=lora_slots + member_slots,
                                  max_rank=config.max_rank,
                                  lora_backend=config.lora_backend,
                                  attention_backend=config.attention_backend,
                                  ops_backend=config.ops_backend, kv_cache=self.pool.kv_cache,
                                  collection_blocks=config.collection_blocks,
                                  collection_rank=config.collection_rank)
        self.adapters = AdapterRegistry(self.runner)
        self.collections = CollectionRegistry(self.runner, self.adapters, base_digest)
        kv_dtype = str(model.dtype).removeprefix("torch.")
        self.block_manager = BlockManager(
            self.pool.kv_view,
            CacheABI(base_digest=base_digest, kv_dtype=kv_dtype, block_size=config.block_size),
            enable_prefix_caching=config.enable_prefix_caching)
        if tokenizer is not None and tokenizer.is_byte_level:
            tokenizer.byte_pieces()  # the streaming table, built now, not at the first token
        self.scheduler = Scheduler(
            SchedulerConfig(max_num_batched_tokens=config.max_num_batched_tokens,
                            max_num_seqs=config.max_num_seqs, max_model_len=max_len,
                            policy=config.scheduling_policy),
            self.block_manager,
            eos_token_ids=(tokenizer.eos_token_ids if tokenizer is not None
                           and tokenizer.eos_token_ids else mc.eos_token_ids),
            adapter_ready=self._ready,
            detokenizer_factory=(None if tokenizer is None
                                 else lambda seq: tokenizer.detokenizer(seq.prompt_token_ids)))
        self.sampler = Sampler(config.sampler_seed, self.scheduler.eos_token_ids)
        self.observers: list[EngineObserver] = []
        """Notified of launched plans and evictions (engine/observer.py)."""
        self.pool.attach(self)
        self.pool.eviction_listener = self._adapter_evicted
        if config.lora_fold and lora_slots > 0:
            self.pool.enable_fold()
        self.lockstep = None if group is None else Lockstep(self, group)
        """This rank's side of tensor-parallel lockstep (None: one device)."""
        self._seqs: dict[str, Sequence] = {}
        self._prefill_after: dict[str, str] = {}
        """Waiting request -> the request whose prompt prefill it waits for (add_request)."""
        self._held: dict[str, AdapterHandle] = {}
        """Live request -> the adapter it holds in the pool (never an eviction victim)."""
        self._logprobs: dict[str, list[TokenLogprobs]] = {}
        self._prompt_logprobs: dict[str, list[TokenLogprobs]] = {}
        self._grammar: dict[str, GrammarState] = {}
        """Live request with a response_format -> its grammar state (tokens accepted)."""
        self._grammar_compiler: GrammarCompiler | None = None
        self._grammar_lock = threading.Lock()
        self._expired: list[RequestOutput] = []
        self._generation = 0
        self._generate_calls = 0
        self.last_step_idle = False
        """True when the last step() found nothing to schedule."""
        self.num_preemptions = 0
        """Requests preempted (by recompute) so far: a counter for tests and metrics."""
        # Plans built for a continuation carry placeholder input ids, so a subclass that
        # overrides build_plan (e.g. to ship plans) keeps the synchronous loop; the TP
        # leader ships them from `execute_plan`, with the deferred tokens.
        plain = type(self).build_plan is Engine.build_plan
        if config.async_scheduling and not plain:
            raise InvalidRequest("async_scheduling is not supported by "
                                 f"{type(self).__name__} (it overrides build_plan)")
        self._async_allowed = plain
        self.async_scheduling = bool(plain and config.async_scheduling)
        """Decided here and again when CUDA graphs are captured (None: on with graphs)."""
        self._inflight: Launched | None = None
        """The launched step whose tokens are not applied yet (async scheduling only)."""
        self.num_overlapped_steps = 0
        """Steps launched before the previous step's tokens reached the host (async)."""
        self.num_discarded_rows = 0
        """Rows of overlapped steps whose request had finished before their tokens came."""
        if config.enable_cuda_graphs:
            self.capture_cuda_graphs()

    def capture_cuda_graphs(self) -> bool:
        """Capture the decode-step CUDA graphs, and with `enable_piecewise_graphs` the
        mixed steps' piecewise graphs (done by the constructor when `enable_cuda_graphs`,
        after the projections point at the pool's address tables: graphs record the tables'
        addresses, whose contents change in place at publication).
        Returns False (nothing captured) off CUDA or when the LoRA path is not graph-safe.
        With `async_scheduling=None` a capture turns async scheduling on (call it before
        the first step)."""
        if self.model.embed_tokens.weight.device.type != "cuda" or not self.runner.graph_safe:
            return False
        if self.runner.graphs is None:
            from dataplane.engine.cuda_graphs import CudaGraphRunner

            self.runner.warm_up_lora()  # eager steps then never wait on Triton's JIT
            self.runner.warm_up_attention()
            graphs = CudaGraphRunner(self.runner, self.config.max_num_seqs,
                                     min(self.max_model_len, self.config.max_graph_context),
                                     group=self.model.tp_group)
            graphs.capture_all()
            self.runner.graphs = graphs
        if self.config.enable_piecewise_graphs and self.runner.piecewise is None:
            from dataplane.engine.piecewise_graphs import PiecewiseGraphRunner

            pieces = PiecewiseGraphRunner(self.runner, self.config.max_num_batched_tokens,
                                          group=self.model.tp_group)
            pieces.capture_all()
            self.runner.piecewise = pieces
        if self.config.async_scheduling is None and self._async_allowed:
            self.async_scheduling = True
        return True

    # ----- adapters -------------------------------------------------------------------
    def register_adapter(self, peft_dir: str | Path) -> AdapterHandle:
        """Validate a PEFT LoRA dir and load it into the pool (the same content returns
        the same handle)."""
        if self.base_abi is None:
            raise AdapterError("this engine has no base ABI to validate PEFT dirs against")
        return self.register_loaded_adapter(
            load_peft_adapter(Path(peft_dir), self.base_abi, self.config.max_rank))

    def register_loaded_adapter(self, adapter: LoadedAdapter, *, key: str | None = None,
                                kv_pages: int = 0, evictable: bool = False,
                                prefetch: bool = False, attempt_id: str | None = None
                                ) -> AdapterHandle:
        """Load factors already in memory into a pool slot under `key` (default: the
        adapter's semantic digest; the same key returns the live handle). The admission
        also proves room for `kv_pages` of KV the caller is about to need. Raises a typed
        error (AdapterError, or a PoolError such as AdmissionRefused) with nothing
        changed when it does not fit.

        Pinned unless `evictable`: an evictable adapter that no live request holds may be
        evicted by KV growth or by another load (LRU among the eligible); its handle then
        goes stale and observers hear `adapter_evicted(key)` (the agent loads adapters
        this way and reloads them on demand).

        A `prefetch` (no request waits for it) must also leave free every KV block the
        running requests may still grow into (`Scheduler.committed_kv_growth`): it never
        takes a page promised to admitted work (engine/prefetch.py). `attempt_id` names
        the pool's load transaction (the agent's load attempt id; one use only).

        Under tensor parallelism (the leader) `adapter` holds the global factors: every
        rank loads its shard, published only when all ranks validated theirs."""
        growth = self.scheduler.committed_kv_growth() if prefetch else None
        if self.lockstep is not None:
            with self.lockstep.lock:
                return self.lockstep.load(adapter, key or adapter.digest, kv_pages, evictable,
                                          growth, attempt_id)
        return self.pool.load(key or adapter.digest, adapter, kv_pages, evictable=evictable,
                              kv_growth=growth, attempt_id=attempt_id)

    def reserve_for_loads(self, pages: int) -> None:
        """Hold `pages` obtainable KV blocks back from admitting new requests (0: none), for
        adapter loads whose requests waited too long (engine/prefetch.py): the running
        requests' growth may still use them, new admissions may not, so finishing
        requests free room for the load instead of more requests on resident adapters."""
        if isinstance(pages, bool) or not isinstance(pages, int) or pages < 0:
            raise InvalidRequest("pages must be an int >= 0", pages=pages)
        self.scheduler.load_reservation = pages

    def unregister_adapter(self, handle: AdapterHandle) -> None:
        """Retire the adapter's slot (reclaimed once no launch reads it); refused while a
        live request uses it."""
        if handle.slot in self.collections.member_slots() and not self.pool.native.holds(
                handle):
            self.adapters.check_handle(handle)
            raise CollectionError("a collection member is freed with its collection "
                                  "(unload_collection)", slot=handle.slot)
        self.adapters.check_handle(handle)
        if handle.slot in self._live_slots():
            raise AdapterError("adapter is used by live requests", slot=handle.slot)
        with self._lock():
            self.pool.unload(handle)

    def _lock(self) -> AbstractContextManager[object]:
        return nullcontext() if self.lockstep is None else self.lockstep.lock

    # ----- tensor parallelism ---------------------------------------------------------
    @property
    def tp_group(self) -> TPGroup | None:
        """This rank's tensor-parallel group (None: one device)."""
        return self.model.tp_group

    def step(self) -> list[RequestOutput]:
        if self.lockstep is None:
            return super().step()
        if not self.lockstep.is_leader:
            raise ProcessGroupError("followers do not schedule; call serve()")
        with self.lockstep.lock:
            return super().step()

    def execute_plan(self, plan: BatchPlan, deferred: DeferredTokens | None) -> torch.Tensor:
        """The step's forward; the TP leader first hands the plan (and the deferred tokens)
        to its followers."""
        if self.lockstep is not None:
            deferred = self.lockstep.send_plan(plan, deferred)
        return self.runner.execute(plan, deferred)

    def serve(self) -> int:
        """A TP follower: execute the leader's plans and loads until it shuts down;
        returns the plans run (engine/lockstep.py)."""
        if self.lockstep is None:
            raise ProcessGroupError("serve() is for the followers of a TP group")
        try:
            return self.lockstep.serve()
        finally:
            self.release_graphs()

    def shutdown(self) -> None:
        """The TP leader releases its followers (their `serve()` returns) and every rank
        drops its captured graphs, which hold the NCCL communicator (before the group is
        destroyed). One device: drops the graphs. Idempotent."""
        if self.lockstep is not None and self.lockstep.is_leader:
            self.lockstep.stop()
        self.release_graphs()

    def release_graphs(self) -> None:
        """Drop the captured decode graphs and mixed-step pieces (later steps run
        eagerly)."""
        for name in ("graphs", "piecewise"):
            graphs = getattr(self.runner, name)
            if graphs is not None:
                graphs.release()
                setattr(self.runner, name, None)

    def _adapter_evicted(self, key: str) -> None:
        for observer in self.observers:
            observer.adapter_evicted(key)

    def _live_slots(self) -> set[int]:
        return {s.adapter_slot for s in self._seqs.values() if not s.is_finished}

    def load_collection(self, bundle: CollectionBundle | str | Path,
                        members: SequenceOf[int] | None = None,
                        served_as: Mapping[int, Placed] | None = None) -> CollectionHandle:
        """Serve members of a Compress-then-Serve collection natively (`EngineConfig.
        collection_blocks` > 0): each cluster's bases resident once in a basis block, a core
        per member slot. `bundle`: a verified bundle or a bundle directory (`adapterctl
        collections download`); `members`: bundle positions (None: all). Members already
        loaded keep their handles; the others are added in one all-or-nothing step (a
        refused load raises CollectionError and changes nothing). Returns one adapter handle
        per member asked for, for `add_request`. `served_as`: the adapter (digest, module
        specs) a member is served as; default: an identity derived from H_collection,
        position and core."""
        return self.collections.load(bundle, members, served_as)

    def unload_collection(self, handle: CollectionHandle) -> None:
        """Free the handle's members and the basis blocks no loaded member still reads;
        refused while one of its members serves a live request."""
        self.collections.unload(handle, self._live_slots())

    # ----- requests -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int],
                    sampling_params: SamplingParams | None = None,
                    adapter: AdapterHandle | None = None, *, tenant: str = "",
                    max_queue_s: float | None = None,
                    base_if_not_invoked: bool = False,
                    prefill_after: str | None = None) -> None:
        """Queue a request whose completed work counts as `tenant`'s service (the agent
        passes the alias's namespace; engine/fairness.py). With `max_queue_s` the request
        is dropped unstarted (an output with finish reason "deadline") unless it is
        admitted within that many seconds, or as soon as the estimated wait for its
        prefill exceeds them (engine/scheduler.py). On an activated LoRA the adapter
        applies from the last occurrence of its invocation tokens in the prompt
        (engine/activation.py); a prompt without them raises AloraNotInvoked, or with
        `base_if_not_invoked` is served by the base model. With `prefill_after` (a live
        request with the same prompt, e.g. the first of n samples) the request is not
        admitted before that one computed its prompt, so it finds the prompt's full blocks
        in the prefix cache instead of prefilling them again. Bad input raises a typed error
        and changes nothing."""
        if not isinstance(tenant, str):
            raise InvalidRequest("tenant must be a str", request_id=request_id)
        deadline = None
        if max_queue_s is not None:
            if (isinstance(max_queue_s, bool) or not isinstance(max_queue_s, int | float)
                    or not math.isfinite(max_queue_s) or max_queue_s <= 0):
                raise InvalidRequest("max_queue_s must be a number > 0", request_id=request_id)
            deadline = self.scheduler.clock() + float(max_queue_s)
        if request_id in self._seqs:
            raise InvalidRequest("duplicate request id", request_id=request_id)
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if any(not isinstance(t, int) or not 0 <= t < self.model.config.vocab_size
               for t in prompt_ids):
            raise InvalidRequest("prompt token ids must be ints in [0, vocab_size)",
                                 request_id=request_id)
        sampling_params = sampling_params or SamplingParams()
        vocab = self.model.config.vocab_size
        if sampling_params.logit_bias and sampling_params.logit_bias[-1][0] >= vocab:
            raise InvalidSamplingParams(f"logit_bias token ids must be < vocab size {vocab}",
                                        request_id=request_id,
                                        token_id=sampling_params.logit_bias[-1][0])
        grammar = None
        if sampling_params.response_format is not None:
            grammar = self.grammar_compiler().compile(sampling_params.response_format).new_state()
        slot, digest, rank, active_from = -1, None, 0, ALWAYS_ON
        if adapter is not None:
            self.adapters.check_handle(adapter)
            if adapter.invocation_tokens is not None:
                offset = activation_offset(prompt_ids, adapter.invocation_tokens)
                if offset is None and not base_if_not_invoked:
                    raise AloraNotInvoked(
                        "the prompt does not contain the adapter's invocation tokens",
                        request_id=request_id,
                        invocation_tokens=list(adapter.invocation_tokens))
                if offset is None:
                    adapter = None  # the caller asked for the base model
                else:
                    active_from = offset
        if adapter is not None:
            slot, digest, rank = adapter.slot, adapter.digest, adapter.max_rank
        seq = Sequence(request_id, tuple(prompt_ids), sampling_params,
                       adapter_slot=slot, adapter_digest=digest, adapter_rank=rank,
                       active_from=active_from, tenant=tenant, queue_deadline=deadline)
        if adapter is not None:
            self.pool.hold(adapter)  # never an eviction victim while this request lives
        try:
            self.scheduler.add(seq)
        except BaseException:
            if adapter is not None:
                self.pool.unhold(adapter)
            raise
        self._seqs[request_id] = seq
        if grammar is not None:
            self._grammar[request_id] = grammar
        if prefill_after is not None and prefill_after in self._seqs:
            self._prefill_after[request_id] = prefill_after
        if adapter is not None:
            self._held[request_id] = adapter
        self._logprobs[request_id] = []
        if sampling_params.prompt_logprobs is not None:
            self._prompt_logprobs[request_id] = []

    def set_tenant_policy(self, weights: Mapping[str, float],
                          priorities: Mapping[str, int]) -> None:
        """Every tenant's weight (> 0, default 1) and priority class (0 high, 1 normal,
        2 low; default 1) for the fair scheduling policy (engine/fairness.py); tenants not
        named get the defaults. InvalidRequest with nothing changed on bad input."""
        self.scheduler.tenants.set_policy(weights, priorities)

    def tenant_service(self) -> dict[str, float]:
        """Tenant -> completed weighted service so far (engine/fairness.py)."""
        return self.scheduler.tenants.snapshot()

    def admission_counts(self) -> dict[str, int]:
        """Requests offered (added), admitted (first scheduled) and expired (dropped
        unstarted at their queue deadline) so far."""
        return dict(self.scheduler.counts)

    def queue_wait_estimate(self) -> float:
        """Seconds a request added now would wait for its prefill, by the scheduler's
        estimate (the queued prompt tokens over the step budget, times the recent interval
        between steps): what the agent's Retry-After says."""
        sched = self.scheduler
        queued = sum(s.num_tokens - s.num_computed_tokens for s in sched.waiting)
        return (queued // sched.config.max_num_batched_tokens + 1) * (sched.step_interval or 0.0)

    def encode(self, text: str) -> list[int]:
        """A text prompt's token ids, as `add_request` encodes it (InvalidRequest without a
        tokenizer)."""
        if self.tokenizer is None:
            raise InvalidRequest("text prompts need a tokenizer; pass token ids")
        return self.tokenizer.encode(text)

    def abort(self, request_id: str) -> bool:
        """Cancel a live request (its blocks are freed). False if it is not live."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return False
        self._forget(request_id)
        if self._inflight is not None and not has_live_rows(self._inflight):
            self._drop_inflight()  # nothing left to apply: retire its plan now, not later
        return True

    def grammar_compiler(self) -> GrammarCompiler:
        """The compiler of structured-output formats for this model's tokenizer and logits
        width, built on first use (reading the vocabulary takes up to a second). Its
        `compile` is thread-safe and cached: a server can compile a request's format off
        the engine thread (and refuse a bad schema) before `add_request`."""
        with self._grammar_lock:
            if self._grammar_compiler is None:
                if self.tokenizer is None:
                    raise InvalidSamplingParams("response_format needs the model's tokenizer")
                self._grammar_compiler = GrammarCompiler.from_tokenizer(
                    self.tokenizer, self.model.config.vocab_size)
            return self._grammar_compiler

    def _ready(self, seq: Sequence) -> bool:
        """Scheduler predicate: the request's adapter is ready (AdapterRegistry.is_ready)
        and it does not wait for another request's prefill. That wait ends for good the
        first time the other request is found past its prompt (or gone)."""
        leader_id = self._prefill_after.get(seq.request_id)
        if leader_id is not None:
            leader = self._seqs.get(leader_id)
            if leader is not None and leader.in_prefill:
                return False
            del self._prefill_after[seq.request_id]
        return self.adapters.is_ready(seq)

    def _forget(self, request_id: str) -> None:
        """A request ended (finished or aborted): drop it and its hold on the adapter."""
        self._seqs.pop(request_id, None)
        self._prefill_after.pop(request_id, None)
        self._logprobs.pop(request_id, None)
        self._prompt_logprobs.pop(request_id, None)
        self._grammar.pop(request_id, None)
        held = self._held.pop(request_id, None)
        if held is not None:
            self.pool.unhold(held)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ----- plans and generate ---------------------------------------------------------
    def on_plan_launched(self, plan: BatchPlan) -> LaunchSnapshot | None:
        """Observers hear the plan; then its launch fence opens (refusing slot generations
        that are no longer published), closed by `on_plan_retired`."""
        if self.observers:
            ranks = {s: h.max_rank for s, h in self.adapters.bound().items()}
            for observer in self.observers:
                observer.plan_launched(plan, ranks)
        try:
            return self.pool.begin_launch(plan.row_slot)
        except StaleGeneration as exc:
            for observer in self.observers:
                observer.launch_refused(exc)
            raise

    def on_plan_retired(self, token: object) -> None:
        """The plan's last use of its slots is now: close its fence (reclaims retired
        slots no launch reads any more)."""
        self.pool.end_launch(cast("LaunchSnapshot | None", token))

    def build_plan(self, out: ScheduleOutput) -> BatchPlan:
        self._generation += 1
        return build_batch_plan(out.prefills, out.decodes, block_size=self.config.block_size,
                                generation=self._generation)

    def generate(self, prompts: SequenceOf[str | list[int]],
                 params: SamplingParams | SequenceOf[SamplingParams] | None = None,
                 adapters: SequenceOf[AdapterHandle | None] | None = None
                 ) -> list[RequestOutput]:
        """Run `prompts` to completion together; final outputs in input order."""
        n = len(prompts)
        plist = (list(params) if isinstance(params, list | tuple)
                 else [params or SamplingParams()] * n)
        alist = list(adapters) if adapters is not None else [None] * n
        if len(plist) != n or len(alist) != n:
            raise InvalidRequest("params and adapters must match prompts in length")
        self._generate_calls += 1
        ids = [f"generate-{self._generate_calls}-{i}" for i in range(n)]
        added: list[str] = []
        try:
            for rid, prompt, p, a in zip(ids, prompts, plist, alist, strict=True):
                self.add_request(rid, prompt, p, a)  # type: ignore[arg-type]
                added.append(rid)
        except Exception:
            for rid in added:
                self.abort(rid)
            raise
        final: dict[str, RequestOutput] = {}
        while len(final) < n:
            for o in self.step():
                if o.finished and o.request_id in ids:
                    final[o.request_id] = o
            if self.last_step_idle and len(final) < n:
                raise EngineStalled("requests are queued but none can be scheduled",
                                    pending=[rid for rid in ids if rid not in final])
        return [final[rid] for rid in ids]
