"""Typed KV-cache errors (stable codes)."""

from __future__ import annotations

from dataplane.core import EngineError


class PoolExhausted(EngineError):
    """Not enough free pages; nothing was allocated."""

    code = "POOL_EXHAUSTED"


class InvalidPageOperation(EngineError):
    """Freeing a page that is not allocated, or under the wrong owner kind (a bug)."""

    code = "INVALID_PAGE_OPERATION"


class KVCapacityError(EngineError):
    """A request can never fit in the KV pool (e.g. its prompt needs more blocks than exist)."""

    code = "KV_CAPACITY"


class InvalidCacheABI(EngineError):
    """The engine's cache ABI fields do not form a valid identity (dataplane.identity)."""

    code = "INVALID_CACHE_ABI"
