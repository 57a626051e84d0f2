"""Engine events handed to the asyncio loop in batches.

The engine loop thread produces one event per request per step (256 at a 256-row
decode step). Waking the event loop once per event (`call_soon_threadsafe` each) costs a
self-pipe write and a loop iteration per token, under the GIL the engine thread also
needs. A :class:`Mailbox` queues events from the engine thread and schedules one drain
while any are pending, so a step's events reach their request queues in one loop
callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import Any, Protocol


class Receiver(Protocol):
    """What a mailbox delivers to (an asyncio.Queue, agent/openai_stream.py's Inbox)."""

    def put_nowait(self, item: Any, /) -> None: ...


class Mailbox:
    """Thread-safe hand-off of `(receiver, item)` pairs into one asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque[tuple[Receiver, Any]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, queue: Receiver, item: Any) -> None:
        """Deliver `item` to `queue` soon (any thread); at most one drain is pending."""
        with self._lock:
            self._items.append((queue, item))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop has closed (shutdown): no reader
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, deque()
            self._scheduled = False
        for queue, item in items:
            queue.put_nowait(item)
