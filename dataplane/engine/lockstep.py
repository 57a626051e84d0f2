"""Tensor parallelism as a parameter of the engine: every rank runs the same `Engine` on its
shard, rank 0 leads and the others follow (docs/ARCHITECTURE.md, "Tensor parallelism").

Every rank builds the same engine (same `EngineConfig`, its shard of the same base,
dataplane/parallel/shard_model.py), so the pools, runners and captured graphs are alike.
Only the leader schedules, samples and returns outputs. Per step it sends the
`BatchPlan` it is about to execute over the `ControlChannel` and every follower executes
that plan (`serve`), so all ranks issue the same collectives in the same order and replay
the same graph. A plan the runner rejects (`EngineError`) is rejected identically, before
any collective, on every rank; followers skip it.

Adapters live in each rank's unified pool. The leader validates the *global* factors,
shards them for itself and loads its shard into its pool, which decides the slot and
pages; the followers shard the same factors and write theirs into the same pages
(`PoolSlots.mirror_publish`). The slot is published only when every rank validated its
shard (`publication.publish_when_all_valid`, one all-gather of votes); otherwise every
rank rolls back and the leader raises `AdapterError`. Slots the leader's pool unpublishes
(an unload reclaimed, an eviction for KV growth or for another load) travel with the next
message, applied before it, so every rank's address tables and LoRA fold see the same
publications in the same order.

Messages (leader -> followers), each with the slots unpublished since the last one:
("plan", dropped, BatchPlan, deferred spec or None), ("place", dropped, slot, generation,
pages, key, adapter), ("stop", dropped).

Async scheduling: the leader launches step N+1 before N's sampled tokens reach its host;
the plan message names where N's tokens go (`DeferredTokens` src/dst), and the tokens
follow as one device broadcast from the leader (the only rank that samples), enqueued
between N's sampling and N+1's forward on every rank.

The leader's step, adapter loads and shutdown hold one lock, so calls from several
threads never interleave their collectives.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

import torch

from dataplane.core import BatchPlan, EngineError
from dataplane.engine.adapters import AdapterError, AdapterHandle, LoadedAdapter
from dataplane.engine.deferred import DeferredTokens
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.control import ControlChannel
from dataplane.parallel.errors import ProcessGroupError
from dataplane.parallel.layout_identity import tp_contract_digest
from dataplane.parallel.publication import (
    NO_IDENTITY,
    PublicationOutcome,
    publish_when_all_valid,
    shard_digest,
)
from dataplane.parallel.shard_model import rank_kernel_local, shard_adapter

if TYPE_CHECKING:
    from dataplane.engine.engine import Engine

PLAN, PLACE, STOP = "plan", "place", "stop"


class Lockstep:
    """One rank's side of the protocol (module docstring), for `engine` on `group`.

    Every rank constructs it at the same point (the control channel is collective)."""

    def __init__(self, engine: Engine, group: TPGroup) -> None:
        self.engine, self.group = engine, group
        self.channel = ControlChannel(group)
        self.lock = threading.RLock()
        self.stopped = False
        if self.is_leader:
            engine.pool.unpublished = []

    @property
    def is_leader(self) -> bool:
        return self.group.rank == 0

    def _dropped(self) -> tuple[int, ...]:
        pool = self.engine.pool
        dropped = tuple(pool.unpublished or ())
        pool.unpublished = []
        return dropped

    # ---- leader ------------------------------------------------------------------------
    def send_plan(self, plan: BatchPlan, deferred: DeferredTokens | None
                  ) -> DeferredTokens | None:
        """Leader, before executing `plan`: the followers get it (and the deferred tokens
        by a device broadcast). Returns the deferred tokens to execute with."""
        spec = None if deferred is None else (len(deferred.tokens), deferred.src, deferred.dst)
        self.channel.send((PLAN, self._dropped(), plan, spec))
        if deferred is None:
            return None
        tokens = deferred.tokens.contiguous()
        self.group.broadcast(tokens, src=0, purpose="tokens")
        return dataclasses.replace(deferred, tokens=tokens)

    def load(self, adapter: LoadedAdapter, key: str, kv_pages: int, evictable: bool,
             kv_growth: int | None = None, attempt_id: str | None = None) -> AdapterHandle:
        """Leader: shard `adapter` (global factors) into every rank's pool; published only
        when all ranks validated their shard (AdapterError, nothing published, if not)."""
        engine = self.engine
        pool = engine.pool
        live = pool.handle_of(key)
        if live is not None:
            return live
        model = engine.model
        mine = shard_adapter(adapter, model.global_config, 0, self.group.size)
        handle = pool.load(key, mine, kv_pages, evictable=evictable, kv_growth=kv_growth,
                           attempt_id=attempt_id)
        pages = pool.pages_of(handle)
        self.channel.send((PLACE, self._dropped(), handle.slot, handle.slot_generation,
                           pages, key, adapter))
        packed = pool.host.peek(key)
        outcome = self._vote(handle.slot, handle.slot_generation, pages, adapter, None,
                             [] if packed is None else [packed.payload])
        if not outcome.published:
            pool.unload(handle)
            raise AdapterError(f"adapter not published: {outcome.reason}", slot=handle.slot)
        if adapter.specs:
            engine.adapters.set_kernel_local(
                handle.slot, tuple(v.kernel_local for v in outcome.votes))
        return handle

    def _vote(self, slot: int, generation: int, pages: tuple[int, ...],
              adapter: LoadedAdapter, error: Exception | None, written: list[torch.Tensor]
              ) -> PublicationOutcome:
        """Every rank: vote on its shard (one collective); all decide alike."""
        identity = NO_IDENTITY
        if error is None and adapter.specs:
            runner = self.engine.runner
            identity = rank_kernel_local(
                adapter.specs, adapter.digest, self.engine.model.global_config,
                self.engine.adapters.kernel_family, str(runner.dtype).split(".")[-1],
                self.group.rank, self.group.size).h_kernel_local
        outcome = publish_when_all_valid(
            self.group, generation=generation,
            contract_digest=tp_contract_digest(adapter.digest, self.group.size, slot, pages),
            local_ok=error is None, local_shard_digest=shard_digest(written),
            publish=lambda: None, rollback=lambda: self._rollback(slot),
            local_kernel_local=identity)
        if error is not None:  # keep this rank's cause in the refusal it reports
            outcome = dataclasses.replace(outcome, reason=f"{outcome.reason}; rank "
                                          f"{self.group.rank}: {error}")
        return outcome

    def _rollback(self, slot: int) -> None:
        if not self.is_leader:  # the leader unloads through its pool (`load`)
            self.engine.pool.mirror_unpublish(slot)

    def stop(self) -> None:
        """Leader: release the followers (their `serve()` returns). Idempotent."""
        with self.lock:
            if self.is_leader and not self.stopped:
                self.stopped = True
                self.channel.send((STOP, self._dropped()))
                self.channel.close()

    # ---- followers ---------------------------------------------------------------------
    def serve(self) -> int:
        """Follower: execute the leader's messages until ("stop",); returns plans run."""
        if self.is_leader:
            raise ProcessGroupError("the leader does not serve")
        plans = 0
        while True:
            message: tuple[Any, ...] = self.channel.recv()
            for slot in message[1]:
                self.engine.pool.mirror_unpublish(slot)
            kind = message[0]
            if kind == STOP:
                self.channel.close()
                self.stopped = True
                return plans
            if kind == PLAN:
                try:
                    self._follow_plan(message[2], message[3])
                except EngineError:
                    continue  # rejected identically by the leader, before any collective
                plans += 1
            elif kind == PLACE:
                self._place(*message[2:])
            else:
                raise ProcessGroupError(f"unknown control message {kind!r}")

    def _follow_plan(self, plan: BatchPlan, spec: tuple[int, tuple[int, ...],
                                                        tuple[int, ...]] | None) -> None:
        deferred = None
        if spec is not None:
            n, src, dst = spec
            tokens = torch.empty(n, dtype=torch.int64, device=self.group.device)
            self.group.broadcast(tokens, src=0, purpose="tokens")
            deferred = DeferredTokens(tokens, src, dst)
        self.engine.runner.execute(plan, deferred)

    def _place(self, slot: int, generation: int, pages: tuple[int, ...], key: str,
               adapter: LoadedAdapter) -> None:
        error: Exception | None = None
        written: list[torch.Tensor] = []
        try:
            mine = shard_adapter(adapter, self.engine.model.global_config, self.group.rank,
                                 self.group.size)
            written = self.engine.pool.mirror_publish(slot, generation, pages, key, mine)
        except Exception as exc:  # a "no" vote, not a raise: every rank must reach the vote
            error = exc
        self._vote(slot, generation, pages, adapter, error, written)
