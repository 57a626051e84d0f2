"""Cold loads of the engine loop: factors downloaded off-thread, placed in a slot.

A loader thread downloads, verifies and reads an artifact's factors (cache miss); the
loop thread then places them in a slot, evicting only an idle adapter, and admits every
waiter. A slot is reclaimed when no request holds it and no alias names it; the catalog
replica's prefetch targets are loaded ahead of requests (:meth:`AdapterLoading._reconcile`).

Mixed into :class:`~agent.serving.EngineLoop`, which owns the state declared here;
every method runs on the loop thread (the loader's completion is queued back to it).
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from agent.artifacts import ArtifactFetcher
from agent.catalog import AgentCatalog, LoadFailed, ServingError
from agent.metrics import AgentMetrics
from agent.residents import Resident, ResidentSet
from agent.tickets import Ticket
from dataplane.core import EngineError
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.engine import Engine
from dataplane.pool.errors import AdmissionRefused, InjectedFault, ValidationFailed

PREFETCH_RETRY_S = 30.0
"""A prefetch that failed is not retried by placement for this long."""


class AdapterLoading:
    """Loads, placement, eviction, reclamation and prefetch (see module docstring)."""

    engine: Engine
    fetcher: ArtifactFetcher
    catalog: AgentCatalog
    metrics: AgentMetrics
    residents: ResidentSet
    failures: deque[dict[str, Any]]
    _failed_at: dict[str, float]
    _cmds: queue.SimpleQueue[Callable[[], None]]
    _live: dict[str, Ticket]
    _loader: ThreadPoolExecutor

    def _enter_engine(self, t: Ticket, handle: AdapterHandle | None) -> None:
        """Admit ``t`` to the engine (provided by :class:`~agent.admission.Admission`)."""
        raise NotImplementedError

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
            self.metrics.evictions.inc()
        try:
            res.handle = self.engine.register_loaded_adapter(
                res.loaded, key=res.info.digest, kv_pages=self._kv_pages(res.waiting),
                evictable=True)
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
        self.metrics.h2d_bytes.inc(res.factor_bytes)
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

    def adapter_evicted(self, key: str) -> None:
        """The engine's pool evicted an idle adapter (KV growth or another load's victim):
        an engine observer event (dataplane/engine/observer.py)."""
        res = self.residents.get(key)
        if res is None or res.handle is None:
            return
        self.residents.remove(key)
        self.metrics.evictions.inc()

    def _unload(self, res: Resident) -> None:
        if res.handle is not None:
            self.engine.unregister_adapter(res.handle)
        self.residents.remove(res.info.digest)

    def _reclaim(self) -> None:
        for res in self.residents.reclaimable():
            if not res.prefetch:
                self._unload(res)
                self.metrics.reclaimed.inc()

    # ---- catalog replica -----------------------------------------------------------------
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
