"""Admission of the engine loop: a ticket enters the engine or waits.

The server resolves `model` to one immutable catalog :class:`~agent.catalog.Generation`
and submits a :class:`~agent.tickets.Ticket` holding it. The loop takes a reference on
that generation's artifact for the request's whole life: if it is in a slot the request
enters the engine at once (cache hit); otherwise it waits for a cold load
(:mod:`agent.adapter_loading`). A republish changes only what *new* tickets resolve to;
running ones keep their slot. Releasing a request's reference reclaims or places what
that unblocks.

Mixed into :class:`~agent.serving.EngineLoop`; every method runs on the loop thread.
"""

from __future__ import annotations

import math
import time
from collections import Counter

from agent.adapter_loading import AdapterLoading
from agent.catalog import Overloaded, QueueTimeout, ServingError
from agent.event_ledger import Lookup
from agent.metrics import rank_bucket
from agent.tickets import BadPrompt, NotInvoked, Ticket
from dataplane.core import EngineError
from dataplane.engine.activation import AloraNotInvoked
from dataplane.engine.adapters import AdapterHandle


class Admission(AdapterLoading):
    """Submit, abort, finish and release of tickets (see module docstring)."""

    max_live: int
    requests_by_digest: Counter[str]

    def _submit(self, t: Ticket) -> None:
        waiting = sum(len(r.waiting) for r in self.residents.by_digest.values())
        if len(self._live) + waiting >= self.max_live:
            self.events.rejected()
            self.metrics.rejected.labels("overloaded").inc()
            t.sink(Overloaded("too many live requests; retry later", limit=self.max_live,
                              retry_after_s=self.retry_after_s()))
            return
        gen = t.generation
        now = time.monotonic()
        if gen is None or gen.artifact is None:
            self.events.enqueued(t.request_id, now, t.tenant, Lookup.BASE)
            self.metrics.admitted.labels("base").inc()
            self._enter_engine(t, None)
            return
        info = gen.artifact
        self.metrics.admitted.labels(rank_bucket(info.max_rank)).inc()
        res = self.residents.get(info.digest) or self.residents.add(info)
        res.refcount += 1
        res.last_use = now
        self.requests_by_digest[info.digest] += 1
        if res.handle is not None:
            self.events.enqueued(t.request_id, now, t.tenant, Lookup.HIT, res.attempt_id)
            t.residency = "resident"
            self._enter_engine(t, res.handle)
            return
        stale = any(d != info.digest and (r := self.residents.get(d)) is not None
                    and r.handle is not None for d in self.catalog.digests_of(gen.name))
        self.events.enqueued(t.request_id, now, t.tenant,
                             Lookup.STALE_MISS if stale else Lookup.COLD_MISS)
        t.residency = "cold"
        res.waiting.append(t)
        if res.retry_at is not None:
            return  # joins the failed load's next attempt, due after its backoff
        if res.loaded is None and not res.inflight:
            self._start_load(res)
        elif res.loaded is not None:
            self._place(res)

    def retry_after_s(self) -> int:
        """When to retry, by the engine's estimate of the queue's wait (at least 1 s)."""
        return max(1, math.ceil(self.engine.queue_wait_estimate()))

    def timed_out(self, t: Ticket) -> QueueTimeout:
        return QueueTimeout(f"the request did not start within {t.max_queue_s:g} s; retry "
                            "later", max_queue_s=t.max_queue_s,
                            retry_after_s=self.retry_after_s())

    def _enter_engine(self, t: Ticket, handle: AdapterHandle | None) -> None:
        left = None
        if t.max_queue_s is not None:  # the time it waited for its adapter counts
            left = t.max_queue_s - (time.monotonic() - t.created)
            if left <= 0:
                self._release(t)
                t.sink(self.timed_out(t))
                return
        try:  # the engine holds `handle` (never an eviction victim) until the request ends
            self.engine.add_request(t.request_id, t.prompt, t.params, handle, tenant=t.tenant,
                                    max_queue_s=left,
                                    base_if_not_invoked=t.base_if_not_invoked,
                                    prefill_after=t.prefill_after)
        except AloraNotInvoked as exc:
            self._release(t)
            t.sink(NotInvoked(exc.message, **exc.detail))
            return
        except EngineError as exc:
            self._release(t)
            t.sink(BadPrompt(str(exc), code=exc.code))
            return
        self._live[t.request_id] = t

    def _expire_cold_waits(self) -> None:
        """Requests still waiting for their adapter past their `max_queue_s` (counted from
        arrival, across every load attempt and retry backoff): 503 now."""
        now = time.monotonic()
        for res in self.residents.by_digest.values():
            late = [t for t in res.waiting if isinstance(t, Ticket) and t.max_queue_s is not None
                    and now - t.created >= t.max_queue_s]
            for t in late:
                res.waiting.remove(t)
                self._release(t)
                t.sink(self.timed_out(t))

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
        """Drop the request's reference; place what that unblocks. A request
        that ends here without a finished output (aborted, expired, failed) completed no
        service."""
        self.events.completed(t.request_id, committed=False)
        if t.generation is not None and t.generation.artifact is not None:
            res = self.residents.get(t.generation.artifact.digest)
            if res is not None:
                res.refcount -= 1
                res.last_use = time.monotonic()
        # any request's end (base-model ones too) frees KV pages a waiting load may need
        for pending in list(self.residents.by_digest.values()):
            if pending.handle is None and pending.loaded is not None:
                self._place(pending)
