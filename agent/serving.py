"""The engine loop: one thread owns the `Engine` and the adapter slots; async callers
talk to it through a command queue and per-request sinks.

Admission (:mod:`agent.admission`): a :class:`Ticket` holding one catalog
generation enters the engine at once when its artifact is in a slot (cache hit), or waits
for a cold load (:mod:`agent.adapter_loading`: download on a loader thread, then
placement in a slot, evicting only an idle adapter; a failed attempt is retried with a
new attempt id while its requests wait). Running requests keep their slot across a
republish; a slot is reclaimed when no request holds it and no alias names it.

Tenant policy (:meth:`EngineLoop.set_tenant_policy`): every namespace's scheduling
weight and priority class from desired state, applied to the engine on the loop thread;
a request's tenant is the namespace of the alias it named (`Ticket.tenant`).

Sinks are called on the loop thread and must not block (the server's sink hands the
event to its asyncio loop). Events (:mod:`agent.tickets`):
:class:`~dataplane.engine.engine.RequestOutput` objects, then nothing more once one is
`finished`, or one :class:`ServingError`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from agent.adapter_loading import PREFETCH_RETRY_S
from agent.admission import Admission
from agent.artifacts import ArtifactFetcher
from agent.catalog import AgentCatalog, ServingError
from agent.engine_thread import EngineThread
from agent.event_ledger import EventLedger
from agent.metrics import AgentMetrics
from agent.residents import ResidentSet
from agent.tickets import BadPrompt, Event, InternalError, Ticket
from dataplane.core import BatchPlan, EngineError
from dataplane.engine.adapters import AdapterHandle
from dataplane.engine.engine import Engine, RequestOutput
from dataplane.engine.fairness import INPUT_WEIGHT, OUTPUT_WEIGHT, PRIORITY_CLASSES
from dataplane.engine.observer import EngineObserver

__all__ = ["PREFETCH_RETRY_S", "BadPrompt", "EngineLoop", "Event", "InternalError",
           "ServingError", "Ticket"]

log = logging.getLogger("adapterplane.agent.serving")

STATUS_INTERVAL_S = 0.25
"""While requests run, `status` (slots, pool and queue gauges, what heartbeats, metrics
and the status endpoints read) is rebuilt at most this often rather than after every
engine step: with a hundred resident adapters a rebuild costs about 5% of the engine
thread's GIL time when done every step (an 8B decode step is ~25 ms). Nothing decides on
it; idle, it is rebuilt every iteration."""


def completed_service(out: RequestOutput) -> float:
    """A finished request's weighted service (engine/fairness.py's weights)."""
    return INPUT_WEIGHT * len(out.prompt_token_ids) + OUTPUT_WEIGHT * len(out.token_ids)


class EngineLoop(Admission, EngineObserver):
    """Single owner of `engine` (see module docstring)."""

    def __init__(self, engine: Engine, fetcher: ArtifactFetcher, catalog: AgentCatalog,
                 metrics: AgentMetrics, max_slots: int, max_live: int,
                 step_delay_s: float = 0.0, *, load_attempts: int,
                 cold_reserve_after_s: float = 0.2,
                 thread: EngineThread | None = None) -> None:
        self.engine = engine
        self.fetcher = fetcher
        self.catalog = catalog
        self.metrics = metrics
        self.max_live = max_live
        self.step_delay_s = step_delay_s
        self.residents = ResidentSet(max_slots)
        self.failures: deque[dict[str, Any]] = deque(maxlen=32)
        self.load_attempts = load_attempts
        self.cold_reserve_after_s = cold_reserve_after_s
        self.requests_by_digest: Counter[str] = Counter()
        """Requests admitted per adapter digest since start (heartbeats report rates)."""
        self.events = EventLedger()
        """The event spine every serving metric advances at (agent/event_ledger.py)."""
        metrics.watch_events(self.events)
        self._failed_at: dict[str, float] = {}
        self._attempt_seq: dict[str, int] = {}
        self.status: dict[str, Any] = {"slots": [], "live": 0}
        self._status_at = 0.0
        self._cmds: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._live: dict[str, Ticket] = {}
        self._downloaded_seen = 0
        self._loader = ThreadPoolExecutor(max_workers=2, thread_name_prefix="adapter-load")
        self.tenants: dict[str, dict[str, Any]] = {}
        """Namespace -> {"weight", "priority"} the engine applies (replaced, never mutated)."""
        self._tenant_service: dict[str, float] = {}
        """The engine's completed weighted service per tenant, as of the last iteration."""
        self._admission: dict[str, int] = {}
        """The engine's offered / admitted / expired counts, as of the last iteration."""
        self._stop = threading.Event()
        self._thread = thread or EngineThread()
        """Where the loop runs: the thread that built `engine` (agent/engine_thread.py)."""
        self._running: Future[None] | None = None
        engine.observers.append(self)  # `adapter_evicted`: the pool evicted an idle adapter

    # ---- thread-safe API -------------------------------------------------------------
    def start(self) -> None:
        self._running = self._thread.submit(self._run)

    def stop(self) -> None:
        self._stop.set()
        if self._running is not None:
            try:
                failed = self._running.exception(timeout=10)
            except FutureTimeout:
                log.warning("the engine loop did not stop within 10 s")
            else:
                if failed is not None:
                    log.error("the engine loop ended with an error", exc_info=failed)
        self._thread.shutdown()
        self._loader.shutdown(wait=False, cancel_futures=True)

    def submit(self, ticket: Ticket) -> None:
        self._cmds.put(lambda: self._submit(ticket))

    def abort(self, request_id: str) -> None:
        self._cmds.put(lambda: self._abort(request_id))

    def reconcile(self) -> None:
        """Apply the catalog replica: mark named/prefetch residents, reclaim, prefetch."""
        self._cmds.put(self._reconcile)

    def set_tenant_policy(self, tenants: Mapping[str, tuple[float, str]]) -> None:
        """Replace every tenant's (weight, priority class name); tenants not named get the
        engine's defaults (weight 1, normal)."""
        policy = dict(tenants)
        self._cmds.put(lambda: self._set_tenant_policy(policy))

    def tenant_state(self) -> dict[str, dict[str, Any]]:
        """Namespace -> {"weight", "priority", "completed_service"}: the applied policy and
        the engine's service (read on the loop thread), plus tenants served without a
        policy entry (the base model's "")."""
        service = self._tenant_service
        state = {ns: {**policy, "completed_service": service.get(ns, 0.0)}
                 for ns, policy in self.tenants.items()}
        for ns, done in service.items():
            state.setdefault(ns, {"weight": 1.0, "priority": "normal",
                                  "completed_service": done})
        return state

    def top(self, k: int) -> dict[str, Any]:
        """The `k` tenants with the most completed service, the `k` adapters with the most
        holders and waiters, and the `k` longest recent queue waits (raw identities are
        here, bounded by `k`, never in metric labels)."""
        tenants = sorted(self._tenant_service.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        slots = sorted(self.status.get("slots", []),
                       key=lambda s: (-(s["refcount"] + s["waiting"]), s["artifact_digest"]))
        waits = sorted(list(self.events.queue_waits), key=lambda w: -w[1])[:k]
        return {"tenants": [{"tenant": t, "completed_service": v} for t, v in tenants],
                "adapters": [{key: s[key] for key in ("artifact_digest", "artifact_id",
                                                      "state", "refcount", "waiting")}
                             for s in slots[:k]],
                "queue_waits": [{"request_id": r, "seconds": w} for r, w in waits]}

    def admission_state(self) -> dict[str, int]:
        """The offered / admitted / expired ledger of the engine's scheduler (requests
        the agent refused before the engine, 429s, are in `/metrics`' rejected counter)."""
        return dict(self._admission)

    # ---- the loop ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._live and self.engine.has_unfinished():
                    cmd = self._cmds.get_nowait()  # a step to run: never wait for commands
                else:  # waiting for adapter loads (short) or idle
                    cmd = self._cmds.get(timeout=0.0005 if self._live else 0.05)
                cmd()
                while True:
                    self._cmds.get_nowait()()
            except queue.Empty:
                pass
            except Exception:  # a bug in one command must not kill serving
                log.exception("engine loop command failed")
            self._expire_cold_waits()
            self._retry_due_loads()
            self._reserve_for_due_loads()
            if self._live and self.engine.has_unfinished():
                self._step()
            now = time.monotonic()
            if not self._live or now - self._status_at >= STATUS_INTERVAL_S:
                self._publish_status()
                self._status_at = now

    def _step(self) -> None:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        try:
            outputs = self.engine.step()
        except Exception as exc:
            log.exception("engine step failed")
            for failed in list(self._live.values()):
                self.engine.abort(failed.request_id)
                self._finish(failed, InternalError(f"engine step failed: {exc}"))
            return
        now = time.monotonic()
        gaps: list[float] = []
        live = self._live
        for out in outputs:
            ticket = live.get(out.request_id)
            if ticket is None:
                continue
            if out.finish_reason == "deadline":  # dropped unstarted by the scheduler
                self._finish(ticket, self.timed_out(ticket))
                continue
            if out.finished:
                self.events.completed(out.request_id, committed=True,
                                      service=completed_service(out))
            if ticket.last_token_at is None:
                self.metrics.ttft.labels(ticket.residency).observe(now - ticket.created)
                self.metrics.observe_prompt(out)
            else:
                gaps.append(now - ticket.last_token_at)
            ticket.last_token_at = now
            ticket.sink(out)
            if out.finished:
                self._finish(ticket, None)
        self.metrics.token_latency.observe_many(gaps)

    def plan_launched(self, plan: BatchPlan, slot_ranks: dict[int, int]) -> None:
        """An engine observer event: the plan's requests were selected (the first time
        ends a request's queue wait)."""
        now = time.monotonic()
        for rid in plan.request_ids:
            self.events.selected(rid, now)

    def _set_tenant_policy(self, tenants: dict[str, tuple[float, str]]) -> None:
        weights = {ns: weight for ns, (weight, _) in tenants.items()}
        try:
            priorities = {ns: PRIORITY_CLASSES[name] for ns, (_, name) in tenants.items()}
            self.engine.set_tenant_policy(weights, priorities)
        except (KeyError, EngineError) as exc:  # the engine keeps the policy it had
            log.warning("tenant policy refused: %s", exc)
            return
        self.tenants = {ns: {"weight": float(weight), "priority": name}
                        for ns, (weight, name) in tenants.items()}

    # ---- status ----------------------------------------------------------------------------
    def _native_collection(self, handle: AdapterHandle | None) -> str | None:
        """H_collection when `handle`'s slot is served from a collection's shared bases."""
        return None if handle is None else self.engine.pool.collection_of(handle.slot)

    def _publish_status(self) -> None:
        # each bound slot's H_kernel_local (one per TP rank under TP; AdapterRegistry)
        kernel_local = self.engine.adapters.kernel_local
        slots = [{"artifact_digest": r.info.digest, "artifact_id": r.info.id,
                  "state": r.state.value, "refcount": r.refcount,
                  "slot": r.handle.slot if r.handle else None,
                  "slot_generation": r.handle.slot_generation if r.handle else None,
                  "kernel_local": list(kernel_local.get(r.handle.slot, ()))
                  if r.handle else [],
                  "collection": self._native_collection(r.handle),
                  "prefetch": r.prefetch, "waiting": len(r.waiting),
                  "attempt_id": r.attempt_id, "attempts": r.attempts}
                 for r in self.residents.by_digest.values()]
        pool = self.engine.pool.gauges()
        kv = self.engine.block_manager.pool
        # free_pages / pool_pages: the KV block pool, what the heartbeat's load reports
        self.status = {"slots": slots, "live": len(self._live),
                       "load_failures": list(self.failures), "pool": pool,
                       "requests": dict(self.requests_by_digest),
                       "free_pages": kv.num_free, "pool_pages": kv.num_pages,
                       "events": self.events.summary()}
        self._tenant_service = self.engine.tenant_service()
        self._admission = self.engine.admission_counts()
        self.metrics.observe_admission(self._admission, self.engine.queue_wait_estimate())
        registry = self.engine.collections
        if registry.blocks:
            used = sum(len(b) for b in registry.blocks_in_use().values())
            self.metrics.observe_collections(used, registry.blocks, len(registry.member_slots()),
                                             registry.resident_bytes())
        self._downloaded_seen = self.metrics.observe_loop(
            self.residents, pool, kv.num_free, kv.num_pages, len(self._live),
            self.fetcher.downloaded_bytes, self._downloaded_seen)
