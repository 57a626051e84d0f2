"""The real `Engine` on every TP rank, in lockstep: rank 0 leads, the others follow.

Every rank builds the same `TPEngine` (same `EngineConfig`, its shard of the same base),
so the KV caches, LoRA slots and captured CUDA graphs are alike on all ranks. Only the
leader (rank 0) schedules, samples and returns outputs; per step it broadcasts the
`BatchPlan` it is about to execute over the `ControlChannel`, and every follower executes
that same plan (`serve()`), so all ranks issue the same collectives in the same order and
replay the same graph; the leader's step/register/unregister/shutdown hold one lock, so
calls from several threads never interleave their collectives. Adapter loads/unloads go
the same way: the leader validates the
*global* PEFT factors against the global config, broadcasts them with their slot and
generation, every rank shards them into its own tables and the slot is published only
when all ranks have validated their shard (`publication.publish_when_all_valid`);
otherwise every rank rolls back and the leader raises `AdapterError`.

Messages (leader -> followers): ("plan", BatchPlan, deferred spec or None), ("load", slot,
generation, adapter or None), ("stop",). A plan the runner rejects (`EngineError`) is
rejected identically, before any collective of its forward, on every rank; followers skip
it.

Async scheduling (on with CUDA graphs, as for one GPU): the leader launches step N+1
before N's sampled tokens reach its host. N+1's decode rows then carry placeholder ids;
the plan message names where N's tokens go (`DeferredTokens` src/dst), and the tokens
themselves follow as one device broadcast from the leader (the only rank that samples),
enqueued between N's sampling and N+1's forward on every rank (`execute_plan`).

CUDA graphs: decode graphs are captured by `tp_graphs.TPCudaGraphRunner`, and with
`enable_piecewise_graphs` mixed steps by `tp_piecewise.TPPiecewiseGraphRunner` (both count
their collectives per replay), when the engine config enables graphs on CUDA.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from pathlib import Path

import torch

from dataplane.artifacts import BaseModelABI
from dataplane.core import BatchPlan, EngineError
from dataplane.engine.adapters import (
    AdapterError,
    AdapterHandle,
    AdapterRegistry,
    LoadedAdapter,
)
from dataplane.engine.deferred import DeferredTokens
from dataplane.engine.engine import Engine, EngineConfig, RequestOutput
from dataplane.models.llama import LORA_GROUPS
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.control import ControlChannel
from dataplane.parallel.errors import ProcessGroupError
from dataplane.parallel.layout_identity import tp_contract_digest
from dataplane.parallel.llama_tp import TPLlamaForCausalLM, group_peft_modules, layout_choices
from dataplane.parallel.publication import (
    NO_IDENTITY,
    PublicationOutcome,
    publish_when_all_valid,
    shard_digest,
)
from dataplane.tokenizer import Tokenizer

PLAN, LOAD, STOP = "plan", "load", "stop"


class TPAdapterRegistry(AdapterRegistry):
    """Slot bookkeeping of `AdapterRegistry`; factors sharded by the TP model.

    Validates adapters against the model's *global* config (the runner's config is the
    per-rank one) and writes through `TPLlamaForCausalLM.load_adapter`; a load is
    published only when every rank validated its shard.
    """

    def __init__(self, engine: TPEngine) -> None:
        super().__init__(engine.runner)
        self.model, self.channel = engine.tp_model, engine.channel
        backend = getattr(engine.runner, "backend", None)  # none without LoRA slots
        self.backend_family = backend.name if backend is not None else "none"
        """The LoRA backend's name; the model adds `+fold` (`kernel_local_identity`)."""

    def register(self, adapter: LoadedAdapter) -> AdapterHandle:
        """Shard `adapter` into the lowest free slot on every rank (the same content
        returns the existing handle); AdapterError with nothing published otherwise."""
        if self.runner.max_slots == 0:
            raise AdapterError("this engine has LoRA disabled (max_slots=0)")
        for handle in self._by_slot.values():
            if handle.digest == adapter.digest:
                return handle
        free = self.free_slots()
        if not free:
            raise AdapterError("no free adapter slot", max_slots=self.runner.max_slots)
        slot = free[0]
        self.check_fits(adapter)
        generation = self._generations.get(slot, 0) + 1
        self._write_slot(slot, generation, adapter)
        self._generations[slot] = generation
        handle = AdapterHandle(slot, adapter.digest, generation, adapter.max_rank,
                               adapter.source)
        self._by_slot[slot] = handle
        return handle

    def check_fits(self, adapter: LoadedAdapter) -> None:
        shapes = self.model.global_config.module_shapes
        for m in adapter.modules:
            if m.rank > self.runner.max_rank:
                raise AdapterError(f"adapter rank {m.rank} exceeds max_rank "
                                   f"{self.runner.max_rank}", rank=m.rank)
            if m.module not in shapes:
                raise AdapterError(f"{m.module!r} is not a LoRA projection", module=m.module)
            d_out, d_in = shapes[m.module]
            if not 0 <= m.layer < self.model.global_config.num_layers or \
                    tuple(m.a.shape) != (m.rank, d_in) or tuple(m.b.shape) != (d_out, m.rank):
                raise AdapterError(f"layer {m.layer} {m.module}: factors do not fit the model")

    def _write_slot(self, slot: int, generation: int, adapter: LoadedAdapter) -> None:
        """Every rank shards `adapter` into `slot`; published only when all ranks voted yes."""
        self.channel.send((LOAD, slot, generation, adapter))
        outcome = self.load_local(slot, generation, adapter)
        if not outcome.published:
            raise AdapterError(f"adapter not published: {outcome.reason}", slot=slot)

    def unregister(self, handle: AdapterHandle) -> None:
        """Clear `handle`'s slot on every rank (the engine refuses it while in use)."""
        self.check_handle(handle)
        self.channel.send((LOAD, handle.slot, handle.slot_generation, None))
        self.load_local(handle.slot, handle.slot_generation, None)
        del self._by_slot[handle.slot]

    def _clear(self, slot: int) -> None:
        for layer in range(len(self.model.layers)):
            for attr in LORA_GROUPS:
                branch = self.model.parallel_linear(layer, attr).branch
                if branch is not None:
                    branch.clear_slot(slot)

    def load_local(self, slot: int, generation: int, adapter: LoadedAdapter | None
                   ) -> PublicationOutcome:
        """Every rank: shard `adapter` (None = clear) into `slot`, then vote (collective)."""
        local_error: Exception | None = None
        identity = NO_IDENTITY
        choices: dict[str, tuple[str, str]] = {}
        try:
            if adapter is None:
                self._clear(slot)
            else:
                self.model.load_adapter(slot, group_peft_modules(adapter.modules))
                if adapter.specs:
                    choices = layout_choices(adapter.specs, self.model.lora_layouts)
                    identity = self.model.kernel_local_identity(
                        adapter.digest, adapter.specs, self.backend_family).h_kernel_local
        except Exception as exc:  # a "no" vote, not a raise: every rank must reach the vote
            local_error = exc
        tensors = []
        for layer in range(len(self.model.layers)):
            for attr in LORA_GROUPS:
                branch = self.model.parallel_linear(layer, attr).branch
                for _k, f in sorted((branch.local.get(slot, {}) if branch else {}).items()):
                    tensors += [f.a, f.b]
        size = self.model.group.size
        contract = hashlib.sha256(json.dumps(
            {"adapter": None if adapter is None else adapter.digest, "slot": slot,
             "tp_size": size, "layouts": self.model.lora_layouts,
             "modules": tp_contract_digest(adapter.digest, size, choices)
             if adapter is not None and choices else None},
            sort_keys=True).encode()).hexdigest()
        outcome = publish_when_all_valid(
            self.model.group, generation=generation, contract_digest=contract,
            local_ok=local_error is None, local_shard_digest=shard_digest(tensors),
            publish=lambda: None, rollback=lambda: self._clear(slot),
            local_kernel_local=identity)
        self.kernel_local.pop(slot, None)
        if outcome.published and identity != NO_IDENTITY:
            self.kernel_local[slot] = tuple(v.kernel_local for v in outcome.votes)
        if local_error is not None:  # keep this rank's cause in the refusal it reports
            outcome = dataclasses.replace(outcome, reason=f"{outcome.reason}; rank "
                                          f"{self.model.group.rank}: {local_error}")
        return outcome


class TPEngine(Engine):
    """`Engine` over this rank's `TPLlamaForCausalLM` (see module docstring).

    All ranks construct it with the same arguments at the same point (the control channel
    and graph capture are collective). On the leader use it as an `Engine`; on a follower
    call `serve()` until the leader calls `shutdown()`.
    """

    def __init__(self, model: TPLlamaForCausalLM, config: EngineConfig, base_digest: str,
                 base_abi: BaseModelABI | None = None, tokenizer: Tokenizer | None = None
                 ) -> None:
        super().__init__(model, dataclasses.replace(config, enable_cuda_graphs=False),
                         base_digest, base_abi, tokenizer)
        self.config = config
        self.tp_model = model
        self.group: TPGroup = model.group
        self.channel = ControlChannel(model.group)
        self.adapters = TPAdapterRegistry(self)
        self.scheduler.adapter_ready = self.adapters.is_ready
        if config.lora_fold and config.max_slots > 0:
            self.runner.enable_lora_fold(config.max_num_seqs)
        self._stopped = False
        # One leader message + its collectives at a time: a step and an adapter load from
        # two threads must not interleave their collectives (ranks would mismatch).
        self._lock = threading.RLock()
        if (self.runner.device.type == "cuda" and config.enable_cuda_graphs
                and self.runner.graph_safe):  # CUDA-only
            from dataplane.parallel.tp_graphs import attach_tp_graphs

            attach_tp_graphs(self.runner, self.group, config.max_num_seqs,
                             min(self.max_model_len, config.max_graph_context))
            self.runner.warm_up_lora()  # local kernels only: eager steps never wait on JIT
            if config.enable_piecewise_graphs:
                from dataplane.parallel.tp_piecewise import attach_tp_piecewise

                attach_tp_piecewise(self.runner, self.group, config.max_num_batched_tokens)
            if config.async_scheduling is None:  # as `Engine`: on with graphs
                self.async_scheduling = True

    @property
    def is_leader(self) -> bool:
        return self.group.rank == 0

    def execute_plan(self, plan: BatchPlan, deferred: DeferredTokens | None) -> torch.Tensor:
        """Leader: send the plan to every follower, then execute it. Under async scheduling
        a continuation plan's decode rows read the previous step's sampled tokens, which
        only the leader's device holds: with the plan goes where they land (`src`, `dst`),
        and the tokens follow as one broadcast on the device (purpose "tokens"), enqueued
        after the sampling that produced them and before the forward that reads them, on
        every rank — no host round trip."""
        spec = None if deferred is None else (len(deferred.tokens), deferred.src, deferred.dst)
        self.channel.send((PLAN, plan, spec))
        if deferred is not None:
            tokens = deferred.tokens.contiguous()
            self.group.broadcast(tokens, src=0, purpose="tokens")
            deferred = dataclasses.replace(deferred, tokens=tokens)
        return self.runner.execute(plan, deferred)

    def _follow_plan(self, plan: BatchPlan, spec: tuple[int, tuple[int, ...], tuple[int, ...]]
                     | None) -> None:
        """Follower: the leader's `execute_plan`, same collectives in the same order."""
        deferred = None
        if spec is not None:
            n, src, dst = spec
            tokens = torch.empty(n, dtype=torch.int64, device=self.group.device)
            self.group.broadcast(tokens, src=0, purpose="tokens")
            deferred = DeferredTokens(tokens, src, dst)
        self.runner.execute(plan, deferred)

    def step(self) -> list[RequestOutput]:
        if not self.is_leader:
            raise ProcessGroupError("followers do not schedule; call serve()")
        with self._lock:
            return super().step()

    def register_adapter(self, peft_dir: str | Path) -> AdapterHandle:
        with self._lock:
            return super().register_adapter(peft_dir)

    def register_loaded_adapter(self, adapter: LoadedAdapter, *, key: str | None = None,
                                kv_pages: int = 0, evictable: bool = False
                                ) -> AdapterHandle:
        """Shard `adapter` into a slot on every rank (its KV is not admitted jointly, and
        nothing evicts it: under TP the factors live in each rank's sharded tables, not
        in the pool)."""
        with self._lock:
            registry = self.adapters
            assert isinstance(registry, TPAdapterRegistry)
            return registry.register(adapter)

    def unregister_adapter(self, handle: AdapterHandle) -> None:
        with self._lock:
            self.adapters.check_handle(handle)
            if handle.slot in self._live_slots():
                raise AdapterError("adapter is used by live requests", slot=handle.slot)
            registry = self.adapters
            assert isinstance(registry, TPAdapterRegistry)
            registry.unregister(handle)

    def serve(self) -> int:
        """Follower: execute the leader's messages until ("stop",); returns plans run."""
        if self.is_leader:
            raise ProcessGroupError("the leader does not serve")
        plans = 0
        while True:
            message = self.channel.recv()
            if message[0] == STOP:
                self.channel.close()
                self.release_graphs()
                return plans
            if message[0] == PLAN:
                try:
                    self._follow_plan(message[1], message[2])
                except EngineError:
                    continue  # rejected identically by the leader, before any collective
                plans += 1
            elif message[0] == LOAD:
                _, slot, generation, adapter = message
                registry = self.adapters
                if isinstance(registry, TPAdapterRegistry):
                    registry.load_local(slot, generation, adapter)
            else:
                raise ProcessGroupError(f"unknown control message {message[0]!r}")

    def shutdown(self) -> None:
        """Leader: release the followers (their `serve()` returns). Idempotent."""
        with self._lock:
            if self.is_leader and not self._stopped:
                self._stopped = True
                self.channel.send((STOP,))
                self.channel.close()
                self.release_graphs()

    def release_graphs(self) -> None:
        """Drop this rank's captured decode graphs and mixed-step pieces (they hold the NCCL
        communicator: every rank releases them before the group is destroyed; steps after
        this run eagerly)."""
        for name in ("graphs", "piecewise"):
            graphs = getattr(self.runner, name)
            if graphs is not None:
                graphs.release()
                setattr(self.runner, name, None)
