"""Paged KV cache: page pool, block manager, prefix cache keyed by the cache ABI. Torch-free."""

from __future__ import annotations

from dataplane.kvcache.block_manager import BlockManager
from dataplane.kvcache.errors import (
    InvalidCacheABI,
    InvalidPageOperation,
    KVCapacityError,
    PoolExhausted,
)
from dataplane.kvcache.page_pool import FreeListPagePool, PageKind, PagePool
from dataplane.kvcache.prefix_cache import PrefixCache
from dataplane.kvcache.prefix_key import CacheABI, chain_keys

__all__ = [
    "BlockManager",
    "CacheABI",
    "FreeListPagePool",
    "InvalidCacheABI",
    "InvalidPageOperation",
    "KVCapacityError",
    "PageKind",
    "PagePool",
    "PoolExhausted",
    "PrefixCache",
    "chain_keys",
]
