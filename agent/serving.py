"""The engine loop: one thread owns the `Engine` and the adapter slots; async callers
talk to it through a command queue and per-request sinks.

Admission (seed §0x07H): the server resolves `model` to one immutable catalog
:class:`~agent.catalog.Generation` and submits a :class:`Ticket` holding it. The loop
takes a reference on that generation's artifact for the request's whole life: if it is
in a slot the request enters the engine at once (cache hit); otherwise it waits while a
loader thread downloads, verifies and reads the factors (cache miss), then the loop
places them in a slot (evicting only an idle adapter) and admits every waiter. A
republish changes only what *new* tickets resolve to; running ones keep their slot,
and a slot is reclaimed when no request holds it and no alias names it.

Sinks are called on the loop thread and must not block (the server's sink hands the
event to its asyncio loop). Events: :class:`~dataplane.engine.engine.RequestOutput`
objects, then nothing more once one is `finished`, or one :class:`ServingError`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agent.artifacts import ArtifactFetcher
from agent.catalog import AgentCatalog, Generation, LoadFailed, Overloaded, ServingError
from agent.metrics import AgentMetrics, rank_bucket
from agent.residents import Resident, ResidentSet
from agent.slot_backends import EngineSlots, SlotBackend
from dataplane.core import EngineError, SamplingParams
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.engine import Engine, RequestOutput
from dataplane.pool.errors import AdmissionRefused, InjectedFault, PoolError, ValidationFailed

log = logging.getLogger("adapterplane.agent.serving")
Event = RequestOutput | ServingError
PREFETCH_RETRY_S = 30.0
"""A prefetch that failed is not retried by placement for this long."""


class InternalError(ServingError):
    status, code = 500, "ENGINE_ERROR"


class BadPrompt(ServingError):
    status, code = 422, "VALIDATION_ERROR"


@dataclass
class Ticket:
    """One admitted request; `generation` None = base model."""

    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    generation: Generation | None
    sink: Callable[[Event], None]
    created: float = field(default_factory=time.monotonic)
    residency: str = "base"
    last_token_at: float | None = None
    held: AdapterHandle | None = None
    """The slot handle this request holds in the backend (from engine entry to its end)."""


class EngineLoop:
    """Single owner of `engine` (see module docstring)."""

    def __init__(self, engine: Engine, fetcher: ArtifactFetcher, catalog: AgentCatalog,
                 metrics: AgentMetrics, max_slots: int, max_live: int,
                 step_delay_s: float = 0.0) -> None:
        self.engine = engine
        self.slots: SlotBackend = getattr(engine, "slots", None) or EngineSlots(engine)
        self.fetcher = fetcher
        self.catalog = catalog
        self.metrics = metrics
        self.max_live = max_live
        self.step_delay_s = step_delay_s
        self.residents = ResidentSet(max_slots)
        self.failures: deque[dict[str, Any]] = deque(maxlen=32)
        self._failed_at: dict[str, float] = {}
        self.status: dict[str, Any] = {"slots": [], "live": 0}
        self._cmds: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._live: dict[str, Ticket] = {}
        self._downloaded_seen = 0
        self._loader = ThreadPoolExecutor(max_workers=2, thread_name_prefix="adapter-load")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.slots.set_eviction_listener(self._evicted)

    # ---- thread-safe API -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._loader.shutdown(wait=False, cancel_futures=True)

    def submit(self, ticket: Ticket) -> None:
        self._cmds.put(lambda: self._submit(ticket))

    def abort(self, request_id: str) -> None:
        self._cmds.put(lambda: self._abort(request_id))

    def reconcile(self) -> None:
        """Apply the catalog replica: mark named/prefetch residents, reclaim, prefetch."""
        self._cmds.put(self._reconcile)

    # ---- the loop ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            busy = bool(self._live)
            try:
                cmd = self._cmds.get(timeout=0.0005 if busy else 0.05)
                cmd()
                while True:
                    self._cmds.get_nowait()()
            except queue.Empty:
                pass
            except Exception:  # a bug in one command must not kill serving
                log.exception("engine loop command failed")
            if self._live and self.engine.has_unfinished():
                self._step()
            self._publish_status()

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
        for out in outputs:
            ticket = self._live.get(out.request_id)
            if ticket is None:
                continue
            if ticket.last_token_at is None:
                self.metrics.ttft.labels(ticket.residency).observe(now - ticket.created)
            else:
                self.metrics.token_latency.observe(now - ticket.last_token_at)
            ticket.last_token_at = now
            ticket.sink(out)
            if out.finished:
                self._finish(ticket, None)

    # ---- admission -----------------------------------------------------------------------
    def _submit(self, t: Ticket) -> None:
        waiting = sum(len(r.waiting) for r in self.residents.by_digest.values())
        if len(self._live) + waiting >= self.max_live:
            self.metrics.rejected.labels("overloaded").inc()
            t.sink(Overloaded("too many live requests; retry later", limit=self.max_live))
            return
        gen = t.generation
        if gen is None or gen.artifact is None:
            self.metrics.admitted.labels("base").inc()
            self._enter_engine(t, None)
            return
        info = gen.artifact
        self.metrics.admitted.labels(rank_bucket(info.max_rank)).inc()
        res = self.residents.get(info.digest) or self.residents.add(info)
        res.refcount += 1
        res.last_use = time.monotonic()
        if res.handle is not None:
            self.metrics.cache_hits.inc()
            t.residency = "resident"
            self._enter_engine(t, res.handle)
            return
        self.metrics.cache_misses.inc()
        t.residency = "cold"
        res.waiting.append(t)
        if res.loaded is None and not res.inflight:
            self._start_load(res)
        elif res.loaded is not None:
            self._place(res)

    def _enter_engine(self, t: Ticket, handle: AdapterHandle | None) -> None:
        try:
            if handle is not None:
                self.slots.hold(handle)  # never an eviction victim while this request runs
                t.held = handle
            self.engine.add_request(t.request_id, t.prompt, t.params, handle)
        except (EngineError, PoolError) as exc:
            self._release(t)
            t.sink(BadPrompt(str(exc), code=exc.code))
            return
        self._live[t.request_id] = t

    def _abort(self, request_id: str) -> None:
        ticket = self._live.get(request_id)
        if ticket is not None:
            self.engine.abort(request_id)
            self._finish(ticket, None)
            return
        for res in self.residents.by_digest.values():
            for t in list(res.waiting):
                if isinstance(t, Ticket) and t.request_id == request_id:
                    res.waiting.remove(t)
                    self._release(t)

    def _finish(self, t: Ticket, error: ServingError | None) -> None:
        self._live.pop(t.request_id, None)
        if error is not None:
            t.sink(error)
        self._release(t)

    def _release(self, t: Ticket) -> None:
        """Drop the request's reference; reclaim or place what that unblocks."""
        if t.held is not None:
            self.slots.unhold(t.held)
            t.held = None
        if t.generation is not None and t.generation.artifact is not None:
            res = self.residents.get(t.generation.artifact.digest)
            if res is not None:
                res.refcount -= 1
                res.last_use = time.monotonic()
                self._reclaim()
        # any request's end (base-model ones too) frees KV pages a waiting load may need
        for pending in list(self.residents.by_digest.values()):
            if pending.handle is None and pending.loaded is not None:
                self._place(pending)

    # ---- loads ---------------------------------------------------------------------------
    def _start_load(self, res: Resident) -> None:
        res.inflight = True
        res.started = time.monotonic()
        self.metrics.load_requests.inc()
        digest = res.info.digest
        future = self._loader.submit(self.fetcher.load, res.info)

        def done(f: Future[LoadedAdapter]) -> None:
            self._cmds.put(lambda: self._loaded(digest, f))

        future.add_done_callback(done)

    def _loaded(self, digest: str, future: Future[LoadedAdapter]) -> None:
        res = self.residents.get(digest)
        if res is None:
            return
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
            return
        self._place(res)

    def _load_failed(self, res: Resident, exc: ServingError, stage: str) -> None:
        self.metrics.load_failures.labels(stage).inc()
        self.metrics.load_latency.labels("failed").observe(time.monotonic() - res.started)
        self.failures.append({"artifact": res.info.digest, "error": exc.message,
                              "stage": stage, "at": time.time()})
        self._failed_at[res.info.digest] = time.monotonic()
        self.residents.remove(res.info.digest)
        for t in res.waiting:
            if isinstance(t, Ticket):
                t.sink(exc)
        res.waiting.clear()

    def _place(self, res: Resident) -> None:
        """Put loaded factors in a slot (evicting one idle adapter if needed)."""
        if res.handle is not None or res.loaded is None:
            return
        if self.residents.free_slots <= 0:
            victim = self.residents.idle_victim(protect=res.info.digest)
            if victim is None:
                return  # retried when a request releases a slot
            self._unload(victim)
            self.metrics.evictions.inc()
        try:
            res.handle = self.slots.load(res.info.digest, res.loaded,
                                         kv_pages=self._kv_pages(res.waiting))
        except AdmissionRefused as exc:
            if self._live:
                return  # KV (or a held adapter) frees when a live request ends: retried then
            self._load_failed(res, LoadFailed(f"adapter load refused: {exc}"), "admission")
            return
        except (EngineError, PoolError) as exc:
            stage = ("validate" if isinstance(exc, ValidationFailed)
                     else str(exc.detail.get("point", "engine"))
                     if isinstance(exc, InjectedFault) else "engine")
            self._load_failed(res, LoadFailed(f"adapter load refused: {exc}"), stage)
            return
        self.metrics.h2d_bytes.inc(res.factor_bytes)
        ranks = getattr(self.engine, "slot_ranks", None)
        if ranks is not None:
            ranks[res.handle.slot] = res.info.max_rank
        self.metrics.load_latency.labels("ok").observe(time.monotonic() - res.started)
        waiting, res.waiting = res.waiting, []
        for t in waiting:
            if isinstance(t, Ticket):
                self._enter_engine(t, res.handle)

    def _kv_pages(self, waiting: list[object]) -> int:
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

    def _evicted(self, digest: str) -> None:
        """The slot backend evicted an idle adapter (KV growth or another load's victim)."""
        res = self.residents.get(digest)
        if res is None or res.handle is None:
            return
        getattr(self.engine, "slot_ranks", {}).pop(res.handle.slot, None)
        self.residents.remove(digest)
        self.metrics.evictions.inc()

    def _unload(self, res: Resident) -> None:
        if res.handle is not None:
            self.slots.unload(res.handle)
            getattr(self.engine, "slot_ranks", {}).pop(res.handle.slot, None)
        self.residents.remove(res.info.digest)

    def _reclaim(self) -> None:
        for res in self.residents.reclaimable():
            if not res.prefetch:
                self._unload(res)
                self.metrics.reclaimed.inc()

    def _reconcile(self) -> None:
        named = self.catalog.named_digests()
        wanted = {i.digest: i for i in self.catalog.prefetch_targets()}
        for res in self.residents.by_digest.values():
            res.named = res.info.digest in named
            res.prefetch = res.info.digest in wanted
        self._reclaim()
        self.metrics.publication_generation.set(self.catalog.version)
        loading = sum(1 for r in self.residents.by_digest.values() if r.handle is None)
        now = time.monotonic()
        for digest, info in wanted.items():
            if digest in self.residents.by_digest or self.residents.free_slots - loading <= 0:
                continue
            if now - self._failed_at.get(digest, -PREFETCH_RETRY_S) < PREFETCH_RETRY_S:
                continue  # requests still retry at once; placement waits a while
            res = self.residents.add(info)
            res.prefetch = True
            loading += 1
            self._start_load(res)

    # ---- status ----------------------------------------------------------------------------
    def _publish_status(self) -> None:
        slots = [{"artifact_digest": r.info.digest, "artifact_id": r.info.id,
                  "state": r.state.value, "refcount": r.refcount,
                  "slot": r.handle.slot if r.handle else None,
                  "slot_generation": r.handle.slot_generation if r.handle else None,
                  "prefetch": r.prefetch, "waiting": len(r.waiting)}
                 for r in self.residents.by_digest.values()]
        pool = self.slots.gauges()
        self.status = {"slots": slots, "live": len(self._live),
                       "load_failures": list(self.failures), "pool": pool}
        kv = self.engine.block_manager.pool
        self._downloaded_seen = self.metrics.observe_loop(
            self.residents, pool, kv.num_free, kv.num_pages, len(self._live),
            self.fetcher.downloaded_bytes, self._downloaded_seen)
