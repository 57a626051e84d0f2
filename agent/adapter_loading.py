"""Cold loads of the engine loop: factors downloaded off-thread, placed in a slot.

A loader thread downloads, verifies and reads an artifact's factors (cache miss); the
loop thread then places them in a slot, evicting only an idle adapter, and admits every
waiter. An adapter no alias names any more stays in its slot as `cached` when no request
holds it (a rollback finds it warm) until a load or KV growth needs the room; the catalog
replica's prefetch targets are loaded ahead of requests (:meth:`AdapterLoading._reconcile`).

Each load is a sequence of attempts, each with its own id (`Resident.attempt_id`). An
attempt that fails before publication has already been rolled back by the pool's load
transaction; the loop checks that nothing stayed reserved or staged, records the failure
with its attempt id, and, while requests still wait and `load_attempts` is not used up,
starts a new attempt (new id, from the download on) after a short backoff. The waiting
requests stay queued meanwhile with their original arrival time, so their TTFT and their
`max_queue_ms` count every attempt; after the last attempt they get `LoadFailed` (503).

Mixed into :class:`~agent.serving.EngineLoop`, which owns the state declared here;
every method runs on the loop thread (the loader's completion is queued back to it, and
a retry is started by the loop when it is due, :meth:`AdapterLoading._retry_due_loads`).
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from agent.artifacts import ArtifactFetcher
from agent.catalog import AgentCatalog, LoadFailed, ServingError
from agent.event_ledger import EventLedger
from agent.metrics import AgentMetrics
from agent.residents import Resident, ResidentSet
from agent.tickets import Ticket
from dataplane.core import EngineError
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.engine import Engine
from dataplane.engine.fairness import PRIORITY_CLASSES
from dataplane.engine.prefetch import LoadCandidate, due_loads
from dataplane.pool.errors import AdmissionRefused, InjectedFault, ValidationFailed

PREFETCH_RETRY_S = 30.0
"""A prefetch that failed is not retried by placement for this long."""
LOAD_RETRY_BACKOFF_S = 0.1
"""Wait after a load's first failed attempt before the next; doubled after each later one,
at most `LOAD_RETRY_BACKOFF_MAX_S`."""
LOAD_RETRY_BACKOFF_MAX_S = 2.0

log = logging.getLogger("adapterplane.agent.loading")


class AdapterLoading:
    """Loads, placement, eviction, reclamation and prefetch (see module docstring)."""

    engine: Engine
    fetcher: ArtifactFetcher
    catalog: AgentCatalog
    metrics: AgentMetrics
    residents: ResidentSet
    failures: deque[dict[str, Any]]
    load_attempts: int
    cold_reserve_after_s: float
    events: EventLedger
    tenants: dict[str, dict[str, Any]]
    """Attempts one load may make before its waiters get `LoadFailed` (>= 1)."""
    _failed_at: dict[str, float]
    _attempt_seq: dict[str, int]
    """H_artifact -> attempts started in this process (numbers the attempt ids)."""
    _cmds: queue.SimpleQueue[Callable[[], None]]
    _live: dict[str, Ticket]
    _loader: ThreadPoolExecutor

    def _enter_engine(self, t: Ticket, handle: AdapterHandle | None) -> None:
        """Admit ``t`` to the engine (provided by :class:`~agent.admission.Admission`)."""
        raise NotImplementedError

    # ---- loads ---------------------------------------------------------------------------
    def _start_load(self, res: Resident) -> None:
        """A new load attempt with a fresh id: download and read on a loader thread, then
        placement back on the loop thread (:meth:`_loaded`)."""
        digest = res.info.digest
        n = self._attempt_seq.get(digest, 0) + 1
        self._attempt_seq[digest] = n
        attempt = f"load-{digest[:12]}-{n}"
        res.attempts += 1
        res.attempt_id, res.retry_at = attempt, None
        res.inflight = True
        res.started = time.monotonic()
        self.events.load_started(attempt, digest, res.info.total_bytes, res.started,
                                 prefetch=not self._tickets(res))
        self.metrics.load_requests.inc()
        future = self._loader.submit(self.fetcher.load, res.info)

        def done(f: Future[LoadedAdapter]) -> None:
            self._cmds.put(lambda: self._loaded(digest, attempt, f))

        future.add_done_callback(done)

    def _loaded(self, digest: str, attempt: str, future: Future[LoadedAdapter]) -> None:
        res = self.residents.get(digest)
        if res is None or res.attempt_id != attempt:
            return  # the resident this attempt was for is gone
        res.inflight = False
        exc = future.exception()
        if exc is not None:
            self._load_failed(res, exc if isinstance(exc, ServingError)
                              else LoadFailed(f"adapter load failed: {exc}"), "download")
            return
        res.loaded = future.result()
        self.metrics.host_resident_bytes.set(self.fetcher.cache_bytes())
        if not res.named and not res.waiting and not res.prefetch:
            self.residents.remove(digest)  # retired while loading: nobody wants it
            self.events.released(attempt, time.monotonic())  # its attempt record closes
            return
        self._place(res)

    def _load_failed(self, res: Resident, exc: ServingError, stage: str) -> None:
        """Attempt `res.attempt_id` ended before publication (the pool rolled its
        transaction back). Retry after a backoff while requests wait for it and attempts
        remain; otherwise its waiters get `exc`."""
        now = time.monotonic()
        digest = res.info.digest
        if res.attempt_id is not None:
            self.events.load_completed(res.attempt_id, now, ok=False)
        self.metrics.load_failures.labels(stage).inc()
        self.metrics.load_attempts.labels("failed").inc()
        self.metrics.load_latency.labels("failed").observe(now - res.started)
        leak = self._rollback_leak()
        if leak is not None:  # a bug in the pool's rollback: no retry on top of it
            log.error("load attempt %s left the pool unclean: %s", res.attempt_id, leak)
        waiting = [t for t in res.waiting if isinstance(t, Ticket)]
        retry = leak is None and bool(waiting) and res.attempts < self.load_attempts
        self.failures.append({"artifact": digest, "attempt_id": res.attempt_id,
                              "error": exc.message, "stage": stage, "at": time.time(),
                              "retry": retry})
        self._failed_at[digest] = now
        res.loaded = None
        if retry:
            backoff = LOAD_RETRY_BACKOFF_S * 2 ** (res.attempts - 1)
            res.retry_at = now + min(backoff, LOAD_RETRY_BACKOFF_MAX_S)
            return
        self.residents.remove(digest)
        for t in waiting:
            t.sink(exc)
        res.waiting.clear()

    def _rollback_leak(self) -> str | None:
        """What a failed attempt left in the pool, if anything. Placement runs whole on
        this thread, so between two loop commands no load transaction is open: any page
        still reserved or slot still staging is a leak."""
        gauges = self.engine.pool.gauges()
        reserved = gauges["pages"].get("reserved", 0)
        staging = gauges["slots"].get("staging", 0)
        if reserved or staging:
            return f"{reserved} pages reserved, {staging} slots staging"
        return None

    def _retry_due_loads(self) -> None:
        """Start the next attempt of each failed load whose backoff is over (the loop calls
        this every iteration; it never waits). A load whose waiters all left meanwhile
        (aborted, or past their `max_queue_ms`) is dropped instead."""
        now = time.monotonic()
        for res in list(self.residents.by_digest.values()):
            if res.retry_at is None or res.retry_at > now:
                continue
            if any(isinstance(t, Ticket) for t in res.waiting):
                self._start_load(res)
            else:
                self.residents.remove(res.info.digest)

    # ---- placement, eviction, reclamation -------------------------------------------------
    def _place(self, res: Resident) -> None:
        """Put loaded factors in a slot (evicting one idle adapter if needed)."""
        if res.handle is not None or res.loaded is None:
            return
        if self.residents.free_slots <= 0:
            victim = self.residents.idle_victim(protect=res.info.digest)
            if victim is None:
                return  # retried when a request releases a slot
            self._unload(victim)
            (self.metrics.evictions if victim.named else self.metrics.reclaimed).inc()
        prefetch = not self._tickets(res)
        if prefetch:
            self.events.prefetch_reserved()
        try:
            res.handle = self.engine.register_loaded_adapter(
                res.loaded, key=res.info.digest, kv_pages=self._kv_pages(res.waiting),
                evictable=True, prefetch=prefetch, attempt_id=res.attempt_id)
        except AdmissionRefused as exc:
            if self._live:
                return  # KV (or a held adapter) frees when a live request ends: retried then
            self._load_failed(res, LoadFailed(f"adapter load refused: {exc}"), "admission")
            return
        except EngineError as exc:
            stage = ("validate" if isinstance(exc, ValidationFailed)
                     else str(exc.detail.get("point", "engine"))
                     if isinstance(exc, InjectedFault) else "engine")
            self._load_failed(res, LoadFailed(f"adapter load refused: {exc}"), stage)
            return
        now = time.monotonic()
        res.pages = self.engine.pool.packed_pages(res.info.digest) or 0
        if res.attempt_id is not None:
            self.events.load_completed(res.attempt_id, now, ok=True)
            self.events.published(res.attempt_id)
        self.metrics.h2d_bytes.inc(res.factor_bytes)
        self.metrics.load_attempts.labels("ok").inc()
        self.metrics.load_latency.labels("ok").observe(now - res.started)
        waiting, res.waiting = res.waiting, []
        for t in waiting:
            if isinstance(t, Ticket):
                self.events.bound(t.request_id, res.attempt_id)
                self._enter_engine(t, res.handle)

    @staticmethod
    def _tickets(res: Resident) -> list[Ticket]:
        return [t for t in res.waiting if isinstance(t, Ticket)]

    def _reserve_for_due_loads(self) -> None:
        """Hold back, from the engine's admissions, the pages of the load whose requests
        waited longest past `cold_reserve_after_s` without room (engine/prefetch.py);
        release the hold once no such load is left (every loop iteration)."""
        now = time.monotonic()
        candidates = []
        for res in self.residents.by_digest.values():
            tickets = self._tickets(res)
            if res.handle is not None or res.loaded is None or not tickets:
                continue
            queued = min(t.created for t in tickets)
            pages = self.engine.pool.packed_pages(res.info.digest)
            if pages is None or now - queued < self.cold_reserve_after_s:
                continue  # not offered to the pool yet (placement not refused), or not due
            urgency = min(PRIORITY_CLASSES.get(self.tenants.get(t.tenant, {}).get(
                "priority", "normal"), 1) for t in tickets)
            candidates.append(LoadCandidate(res.info.digest, pages + self._kv_pages(tickets),
                                            queued, urgency))
        due = due_loads(candidates, now, self.cold_reserve_after_s)
        hold = due[0].pages if due else 0
        if hold != self.engine.scheduler.load_reservation:
            self.engine.reserve_for_loads(hold)

    def _kv_pages(self, waiting: Iterable[object]) -> int:
        """Initial KV pages of the waiting requests (prompt + first token), for admission."""
        bs = self.engine.config.block_size
        total = 0
        for t in waiting:
            if not isinstance(t, Ticket):
                continue
            prompt = t.prompt
            if isinstance(prompt, str):
                tok = self.engine.tokenizer
                n = len(tok.encode(prompt)) if tok is not None else len(prompt)
            else:
                n = len(prompt)
            total += -(-(n + 1) // bs)
        return total

    def adapter_evicted(self, key: str) -> None:
        """The engine's pool evicted an idle adapter (KV growth or another load's victim):
        an engine observer event (dataplane/engine/observer.py)."""
        res = self.residents.get(key)
        if res is None or res.handle is None:
            return
        self.residents.remove(key)
        self.events.released(res.attempt_id, time.monotonic(), res.pages)
        self.metrics.evictions.inc()

    def _unload(self, res: Resident) -> None:
        if res.handle is not None:
            self.engine.unregister_adapter(res.handle)
            self.events.released(res.attempt_id, time.monotonic(), res.pages)
        self.residents.remove(res.info.digest)

    # ---- catalog replica -----------------------------------------------------------------
    def _reconcile(self) -> None:
        named = self.catalog.named_digests()
        wanted = {i.digest: i for i in self.catalog.prefetch_targets()}
        for res in self.residents.by_digest.values():
            res.named = res.info.digest in named
            res.prefetch = res.info.digest in wanted
        self.metrics.publication_generation.set(self.catalog.version)
        loading = sum(1 for r in self.residents.by_digest.values() if r.handle is None)
        room = self.residents.free_slots + len(self.residents.cached()) - loading
        now = time.monotonic()
        for digest, info in wanted.items():
            if digest in self.residents.by_digest or room <= 0:
                continue
            if now - self._failed_at.get(digest, -PREFETCH_RETRY_S) < PREFETCH_RETRY_S:
                continue  # requests still retry at once; placement waits a while
            res = self.residents.add(info)
            res.prefetch = True
            room -= 1
            self._start_load(res)
