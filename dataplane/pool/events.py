"""Device-event abstraction the pool waits on (torch-free).

A copy or a kernel launch that may still touch pages is represented by an event
with ``query()`` (done?) and ``synchronize()`` (wait). ``page_storage.CudaEvent``
wraps a real CUDA event; on CPU a synchronous copy yields :class:`CompletedEvent`,
and :class:`PendingEvent` models work still in flight (it performs its deferred
work when first waited on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class CopyEvent(Protocol):
    """What the pool needs of a device event: poll and wait."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class CompletedEvent:
    """An event whose work is already done (synchronous CPU copy, finished kernel)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class PendingEvent:
    """Work that has not happened yet: it runs ``work`` when first waited on."""

    def __init__(self, work: Callable[[], None] | None = None) -> None:
        self._work = work
        self._done = False

    def query(self) -> bool:
        return self._done

    def synchronize(self) -> None:
        if not self._done:
            if self._work is not None:
                self._work()
            self._done = True


class HeldEvent:
    """Fault injection "delay copy": incomplete until waited on; the wait sleeps
    ``delay_s`` (a slow transfer) and then waits for the real event."""

    def __init__(self, inner: CopyEvent, delay_s: float = 0.0) -> None:
        self._inner = inner
        self._delay_s = delay_s
        self._waited = False

    def query(self) -> bool:
        return self._waited and self._inner.query()

    def synchronize(self) -> None:
        if not self._waited and self._delay_s:
            time.sleep(self._delay_s)
        self._waited = True
        self._inner.synchronize()

    @property
    def inner(self) -> CopyEvent:
        return self._inner

    @property
    def staged(self) -> object:
        return getattr(self._inner, "staged", None)

