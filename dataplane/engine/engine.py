"""The public multi-adapter `Engine`: register adapters, add requests, step, generate.

One step = scheduler.schedule() -> build_batch_plan -> ModelRunner.execute (logits of the
sampled rows) -> Sampler -> scheduler.postprocess (docs/ENGINE_CONTRACT.md). With async
scheduling (engine/async_steps.py) the next decode-only step is launched before this one's
tokens reach the host, so host work hides behind the device. Every adapter
lives in one slot of the runner's factor tables; requests bind to an adapter by handle,
and the scheduler gives model rows only to requests whose adapter slot is loaded.

Usage::

    engine = Engine.from_model_dir(path, dtype="float32", device="cpu", max_slots=4)
    h = engine.register_adapter(peft_dir)
    outs = engine.generate([[1, 2, 3], "hello"], SamplingParams(temperature=0), [h, None])
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from pathlib import Path

import torch

from dataplane.artifacts import BaseModelABI, read_base_abi
from dataplane.attention.kv_cache import PagedKVCache
from dataplane.core import (
    BatchPlan,
    EngineError,
    InvalidRequest,
    SamplingParams,
    Sequence,
    build_batch_plan,
)
from dataplane.engine.adapters import (
    AdapterError,
    AdapterHandle,
    AdapterRegistry,
    LoadedAdapter,
    load_peft_adapter,
)
from dataplane.engine.async_steps import Launched, deferred_inputs, has_live_rows, retire
from dataplane.engine.model_runner import ModelRunner
from dataplane.engine.scheduler import ScheduleOutput, Scheduler, SchedulerConfig
from dataplane.kvcache import BlockManager, CacheABI, FreeListPagePool
from dataplane.kvcache.page_pool import PagePool
from dataplane.models import load_model
from dataplane.models.llama import LlamaForCausalLM
from dataplane.sampling.sampler import Sampler, TokenLogprobs
from dataplane.tokenizer import Tokenizer

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class EngineStalled(EngineError):
    """generate() found queued requests that no step can schedule (nothing would change)."""

    code = "ENGINE_STALLED"


@dataclass(frozen=True)
class RequestOutput:
    """A request's state after a step. `new_*` is what this step added (for streaming)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    new_token_ids: tuple[int, ...]
    text: str
    new_text: str
    finished: bool
    finish_reason: str | None
    logprobs: tuple[TokenLogprobs, ...] | None


@dataclass(frozen=True)
class EngineConfig:
    """Sizes of one engine. `num_kv_blocks` x `block_size` tokens of KV for all requests."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_kv_blocks: int = 1024
    block_size: int = 16
    max_slots: int = 8
    max_rank: int = 16
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_cuda_graphs: bool = True
    lora_backend: str | None = None
    attention_backend: str | None = None
    ops_backend: str | None = None
    max_graph_context: int = 4096
    sampler_seed: int | None = 0
    async_scheduling: bool | None = None
    """Launch the next decode-only step before syncing on this one's tokens (None: on
    exactly when CUDA graphs are in use; True also runs the same control flow on CPU)."""

    def __post_init__(self) -> None:
        minimum = {"max_num_seqs": 1, "max_num_batched_tokens": 1, "num_kv_blocks": 1,
                   "block_size": 1, "max_slots": 0, "max_rank": 1, "max_graph_context": 1}
        for name, low in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidRequest(f"{name} must be an int >= {low}", **{name: value})
        if self.async_scheduling not in (None, True, False):
            raise InvalidRequest("async_scheduling must be None, True or False",
                                 async_scheduling=self.async_scheduling)
        if self.max_model_len is not None and (
                not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise InvalidRequest("max_model_len must be an int >= 2",
                                 max_model_len=self.max_model_len)


class Engine:
    """Continuous-batching multi-LoRA engine over one Llama-family base model."""

    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, base_digest: str,
                 base_abi: BaseModelABI | None = None, tokenizer: Tokenizer | None = None,
                 kv_pages: PagePool | None = None, kv_cache: PagedKVCache | None = None
                 ) -> None:
        """`base_digest` is H_base (keys the prefix cache); `base_abi` validates PEFT dirs
        (None: only pre-loaded adapters via `register_loaded_adapter`). `kv_pages` is where
        KV blocks come from (None: a private free list of `num_kv_blocks`; the agent passes
        its unified pool's KV view, whose page ids must index this engine's KV cache, so it
        must hold no more than `num_kv_blocks` pages). `kv_cache` is the KV storage (None: a
        private one; the agent passes page-major views of its unified pool, so KV block i's
        bytes are pool page i's — one buffer for KV and adapters)."""
        self.config = config
        self.base_abi = base_abi
        self.model = model
        self.tokenizer = tokenizer
        mc = model.config
        max_len = config.max_model_len or mc.max_position_embeddings
        self.max_model_len = max_len
        self.runner = ModelRunner(model, config.num_kv_blocks, config.block_size,
                                  max_rows=max(config.max_num_batched_tokens, config.max_num_seqs),
                                  max_slots=config.max_slots, max_rank=config.max_rank,
                                  lora_backend=config.lora_backend,
                                  attention_backend=config.attention_backend,
                                  ops_backend=config.ops_backend, kv_cache=kv_cache)
        self.adapters = AdapterRegistry(self.runner)
        kv_dtype = str(model.dtype).removeprefix("torch.")
        self.block_manager = BlockManager(
            kv_pages if kv_pages is not None else FreeListPagePool(config.num_kv_blocks),
            CacheABI(base_digest=base_digest, kv_dtype=kv_dtype, block_size=config.block_size),
            enable_prefix_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(max_num_batched_tokens=config.max_num_batched_tokens,
                            max_num_seqs=config.max_num_seqs, max_model_len=max_len),
            self.block_manager,
            eos_token_ids=(tokenizer.eos_token_ids if tokenizer is not None
                           and tokenizer.eos_token_ids else mc.eos_token_ids),
            adapter_ready=self.adapters.is_ready,
            detokenizer_factory=(None if tokenizer is None
                                 else lambda seq: tokenizer.detokenizer(seq.prompt_token_ids)))
        self.sampler = Sampler(config.sampler_seed)
        self._seqs: dict[str, Sequence] = {}
        self._logprobs: dict[str, list[TokenLogprobs]] = {}
        self._generation = 0
        self._generate_calls = 0
        self.last_step_idle = False
        """True when the last step() found nothing to schedule."""
        self.num_preemptions = 0
        """Requests preempted (by recompute) so far: a counter for tests and metrics."""
        # Plans built for a continuation carry placeholder input ids, so a subclass that
        # ships plans (build_plan overridden: the TP leader) keeps the synchronous loop.
        # Observers and launch fences use on_plan_launched / on_plan_retired instead,
        # which both loops call (agent metering).
        plain = type(self).build_plan is Engine.build_plan
        if config.async_scheduling and not plain:
            raise InvalidRequest("async_scheduling is not supported by "
                                 f"{type(self).__name__} (it overrides build_plan)")
        self._async_allowed = plain
        self.async_scheduling = bool(plain and config.async_scheduling)
        """Decided here and again when CUDA graphs are captured (None: on with graphs)."""
        if config.enable_cuda_graphs:
            self.capture_cuda_graphs()
        self._inflight: Launched | None = None
        """The launched step whose tokens are not applied yet (async scheduling only)."""
        self.num_overlapped_steps = 0
        """Steps launched before the previous step's tokens reached the host (async)."""
        self.num_discarded_rows = 0
        """Rows of overlapped steps whose request had finished before their tokens came."""

    def capture_cuda_graphs(self) -> bool:
        """Capture the decode-step CUDA graphs (done by the constructor when
        `enable_cuda_graphs`). An owner that re-points the LoRA linears at other factor
        tables (the agent's unified pool) builds the engine with graphs off, attaches, then
        calls this: graphs record the tables' addresses, whose contents change in place.
        Returns False (nothing captured) off CUDA or when the LoRA path is not graph-safe.
        With `async_scheduling=None` a capture turns async scheduling on (call it before
        the first step)."""
        if self.model.embed_tokens.weight.device.type != "cuda" or not self.runner.graph_safe:
            return False
        if self.runner.graphs is None:
            from dataplane.engine.cuda_graphs import CudaGraphRunner

            graphs = CudaGraphRunner(self.runner, self.config.max_num_seqs,
                                     min(self.max_model_len, self.config.max_graph_context))
            graphs.capture_all()
            self.runner.graphs = graphs
        if self.config.async_scheduling is None and self._async_allowed:
            self.async_scheduling = True
        return True

    @classmethod
    def from_model_dir(cls, path: str | Path, *, dtype: str = "float32", device: str = "cpu",
                       **sizes: object) -> Engine:
        """Load config.json + safetensors from `path`; `sizes` are EngineConfig fields."""
        if dtype not in _DTYPES:
            raise InvalidRequest(f"dtype must be one of {sorted(_DTYPES)}", dtype=dtype)
        unknown = set(sizes) - set(EngineConfig.__dataclass_fields__)
        if unknown:
            raise InvalidRequest(f"unknown engine options {sorted(unknown)}")
        config = EngineConfig(**sizes)  # type: ignore[arg-type]
        model = load_model(Path(path), _DTYPES[dtype], torch.device(device))
        abi = read_base_abi(Path(path))
        tokenizer = (Tokenizer.from_dir(path) if (Path(path) / "tokenizer.json").is_file()
                     else None)
        return cls(model, config, abi.h_base, abi, tokenizer)

    # ----- adapters -------------------------------------------------------------------
    def register_adapter(self, peft_dir: str | Path) -> AdapterHandle:
        """Load a PEFT LoRA dir into a free slot (the same content returns the same handle)."""
        if self.base_abi is None:
            raise AdapterError("this engine has no base ABI to validate PEFT dirs against")
        return self.adapters.register(
            load_peft_adapter(Path(peft_dir), self.base_abi, self.config.max_rank))

    def register_loaded_adapter(self, adapter: LoadedAdapter) -> AdapterHandle:
        """Register factors already in memory (benchmarks with synthetic adapters)."""
        return self.adapters.register(adapter)

    def unregister_adapter(self, handle: AdapterHandle) -> None:
        """Free the adapter's slot; refused while a live request uses it."""
        live = {s.adapter_slot for s in self._seqs.values() if not s.is_finished}
        self.adapters.unregister(handle, in_use=handle.slot in live)

    # ----- requests -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int],
                    sampling_params: SamplingParams | None = None,
                    adapter: AdapterHandle | None = None) -> None:
        """Queue a request. Bad input raises a typed error and changes nothing."""
        if request_id in self._seqs:
            raise InvalidRequest("duplicate request id", request_id=request_id)
        prompt_ids = self._encode(prompt) if isinstance(prompt, str) else list(prompt)
        if any(not isinstance(t, int) or not 0 <= t < self.model.config.vocab_size
               for t in prompt_ids):
            raise InvalidRequest("prompt token ids must be ints in [0, vocab_size)",
                                 request_id=request_id)
        slot, digest = -1, None
        if adapter is not None:
            self.adapters.check_handle(adapter)
            slot, digest = adapter.slot, adapter.digest
        seq = Sequence(request_id, tuple(prompt_ids), sampling_params or SamplingParams(),
                       adapter_slot=slot, adapter_digest=digest)
        self.scheduler.add(seq)
        self._seqs[request_id] = seq
        self._logprobs[request_id] = []

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise InvalidRequest("text prompts need a tokenizer; pass token ids")
        return self.tokenizer.encode(text)

    def abort(self, request_id: str) -> bool:
        """Cancel a live request (its blocks are freed). False if it is not live."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return False
        self._seqs.pop(request_id, None)
        self._logprobs.pop(request_id, None)
        if self._inflight is not None and not has_live_rows(self._inflight):
            self._drop_inflight()  # nothing left to apply: retire its plan now, not later
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ----- plan hooks ------------------------------------------------------------------
    def on_plan_launched(self, plan: BatchPlan) -> object:
        """Hook for plan observers and launch fences (both loops, sync and async).

        Called once per plan, after it is built and before its forward is enqueued
        (continuation plans too, whose decode input ids are still placeholders). The
        returned token goes to :meth:`on_plan_retired`. Raising refuses the launch:
        nothing is enqueued and no retire follows. Default: nothing (None)."""
        return None

    def on_plan_retired(self, token: object) -> None:
        """Hook: the plan that :meth:`on_plan_launched` returned `token` for is done.

        Called exactly once per token that `on_plan_launched` returned, in launch order,
        after the plan's forward and sampling were enqueued (or their launch raised) and
        either its tokens reached the host and were applied, or its rows were discarded
        (every request finished or was aborted) — also when the step raised. Device work
        of the plan is complete, or enqueued before anything recorded on the current
        stream now (e.g. a CUDA event marking the plan's last use of adapter slots)."""
        return None

    def _retire(self, step: Launched) -> None:
        """on_plan_retired for `step`, then for its failed followers; at most once."""
        retire(step, self.on_plan_retired)

    def _drop_inflight(self) -> None:
        """Forget the in-flight step (its results are not needed) and retire its plan."""
        step, self._inflight = self._inflight, None
        if step is not None:
            self._retire(step)

    # ----- stepping -------------------------------------------------------------------
    def build_plan(self, out: ScheduleOutput) -> BatchPlan:
        self._generation += 1
        return build_batch_plan(out.prefills, out.decodes, block_size=self.config.block_size,
                                generation=self._generation)

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; outputs for every request that got a token.

        Async scheduling: the returned outputs are those of the oldest launched step; before
        waiting for its tokens the next decode-only step is launched (when the scheduler can
        decide it now), and it stays in flight across this call."""
        if not self.async_scheduling:
            launched = self._schedule_and_launch()
            return [] if launched is None else self._finish_step(launched, None)
        cur, self._inflight = self._inflight, None
        if cur is not None and not has_live_rows(cur):
            self._retire(cur)  # every request in it finished or was aborted: nothing to apply
            cur = None
        if cur is None:
            cur = self._schedule_and_launch()
            if cur is None:
                return []
        self.last_step_idle = False
        return self._finish_step(cur, self._launch_continuation)

    def _schedule_and_launch(self) -> Launched | None:
        out = self.scheduler.schedule()
        self.num_preemptions += len(out.preempted)
        self.last_step_idle = out.is_empty
        return None if out.is_empty else self._launch_step(out, None)

    def _launch_step(self, out: ScheduleOutput, prev: Launched | None) -> Launched:
        """Build the plan, enqueue the forward and the sampling; no host sync. With `prev`
        (still in flight, tokens reserved) its sampled tokens feed the placeholder rows."""
        plan = self.build_plan(out)
        if [s.request_id for s in out.sampled] != list(plan.sample_request_ids):
            raise InvalidRequest("plan sample order differs from the scheduler's")
        token = self.on_plan_launched(plan)
        try:
            deferred = None if prev is None else deferred_inputs(plan, out, prev)
            logits = self.runner.execute(plan, deferred)
            pending = self.sampler.launch(logits, out.sampled)
        except BaseException:
            if prev is None:
                self.on_plan_retired(token)
            else:
                prev.after.append(token)  # retired right after `prev`: launch order
            raise
        return Launched(out, pending, token)

    def _launch_continuation(self, cur: Launched) -> None:
        """After `cur` is committed and reserved: launch the next step if it is decidable."""
        nxt = self.scheduler.schedule_continuation(cur.out)
        if nxt is not None:
            self._inflight = self._launch_step(nxt, cur)
            self.num_overlapped_steps += 1

    def _finish_step(self, cur: Launched, overlap: Callable[[Launched], None] | None
                ) -> list[RequestOutput]:
        """Commit `cur`, run `overlap` (launch the next step) while it computes, then wait
        for its tokens, apply them and build the outputs. `cur`'s plan is retired once its
        tokens are applied, or when this raises."""
        dropped: Launched | None = None
        try:
            self.scheduler.commit_computed(cur.out)
            self.scheduler.reserve_tokens(cur.out)
            if overlap is not None:
                try:
                    overlap(cur)
                except Exception:
                    # `cur` is applied below; the next step re-plans
                    dropped, self._inflight = self._inflight, None
                    self.scheduler.apply_tokens(cur.out, cur.pending.result().token_ids)
                    raise
            result = cur.pending.result()
            updates = self.scheduler.apply_tokens(cur.out, result.token_ids)
        finally:
            try:
                self._retire(cur)
            finally:
                if dropped is not None:
                    self._retire(dropped)
        if self._inflight is not None:
            self.num_discarded_rows += sum(s.is_finished for s in self._inflight.out.decodes)
            if not has_live_rows(self._inflight):
                self._drop_inflight()
        by_id = {s.request_id: lp
                 for s, lp in zip(cur.out.sampled, result.logprobs, strict=True)}
        outputs = []
        for u in updates:
            seq = u.seq
            lp = by_id.get(seq.request_id)
            if lp is not None:
                self._logprobs[seq.request_id].append(lp)
            outputs.append(self._output(seq, (u.token_id,), u.text))
            if u.finished:
                self._seqs.pop(seq.request_id, None)
                self._logprobs.pop(seq.request_id, None)
        return outputs

    def _output(self, seq: Sequence, new_ids: tuple[int, ...], new_text: str) -> RequestOutput:
        lps = self._logprobs.get(seq.request_id, [])
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids,
            token_ids=tuple(seq.output_token_ids), new_token_ids=new_ids,
            text=seq.output_text, new_text=new_text, finished=seq.is_finished,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            logprobs=tuple(lps) if seq.sampling.logprobs is not None else None)

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
