"""Where adapter factors live for the engine: two interchangeable slot backends.

* :class:`~agent.pool_slots.PoolSlots` (default): KV blocks and adapter factors share
  one unified page pool (:mod:`dataplane.pool`); loads are admission transactions that
  compete with KV growth, launches are fenced by slot generations (see that module).
* :class:`EngineSlots`: the engine's own per-slot factor tables
  (`Engine.register_loaded_adapter`) and its private KV free list.

Both hand back the engine's :class:`AdapterHandle` so requests bind to a slot the
engine's scheduler checks. The agent tells the backend when a request bound to a
handle enters the engine (`hold`) and ends (`unhold`); a backend that can evict an
idle adapter on its own reports it through the eviction listener.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from agent.native_members import NativeSlots
from agent.pool_slots import PoolSlots
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.engine import Engine

__all__ = ["EngineSlots", "PoolSlots", "SlotBackend"]


class SlotBackend(Protocol):
    def load(self, key: str, adapter: LoadedAdapter, kv_pages: int = 0) -> AdapterHandle: ...

    def unload(self, handle: AdapterHandle) -> None: ...

    def hold(self, handle: AdapterHandle) -> None: ...

    def unhold(self, handle: AdapterHandle) -> None: ...

    def set_eviction_listener(self, listener: Callable[[str], None]) -> None: ...

    def begin_launch(self, row_slots: tuple[int, ...]) -> Any: ...

    def end_launch(self, snap: Any) -> None: ...

    def gauges(self) -> dict[str, dict[str, int]]: ...


class EngineSlots:
    """Factors in the engine's own tables; never evicts on its own. A `NativeMember`
    (agent/native_members.py) is served from the engine's collection tables instead."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.native = NativeSlots()

    def load(self, key: str, adapter: LoadedAdapter, kv_pages: int = 0) -> AdapterHandle:
        member = self.native.load(self.engine, adapter)
        return member if member is not None else self.engine.register_loaded_adapter(adapter)

    def unload(self, handle: AdapterHandle) -> None:
        if not self.native.unload(self.engine, handle):
            self.engine.unregister_adapter(handle)

    def collection_of(self, slot: int) -> str | None:
        return self.native.collection_of(slot)

    def hold(self, handle: AdapterHandle) -> None:
        return None

    def unhold(self, handle: AdapterHandle) -> None:
        return None

    def set_eviction_listener(self, listener: Callable[[str], None]) -> None:
        return None

    def begin_launch(self, row_slots: tuple[int, ...]) -> Any:
        return None

    def end_launch(self, snap: Any) -> None:
        return None

    def gauges(self) -> dict[str, dict[str, int]]:
        return {}
