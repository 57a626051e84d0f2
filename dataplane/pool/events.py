"""Device-event abstraction the pool waits on (torch-free).

A copy or a kernel launch that may still touch pages is represented by an event
with ``query()`` (done?) and ``synchronize()`` (wait). ``page_storage.CudaEvent``
wraps a real CUDA event; on CPU a synchronous copy yields :class:`CompletedEvent`,
and :class:`PendingEvent` models work still in flight (it performs its deferred
work when first waited on).
"""

from __future__ import annotations

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
