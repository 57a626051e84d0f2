"""Index of published KV blocks by chain key, plus the LRU of evictable (unreferenced) ones.

A block is published only after its K/V rows were computed, so a hit never reads rows that
are still being written. A hit is verified against the stored (prev key, token ids), not
trusted on the hash alone. Blocks with no references stay cached and evictable; the block
manager reuses the least recently released one first when the pool runs dry.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class CachedBlock:
    key: bytes
    prev: bytes
    token_ids: tuple[int, ...]


class PrefixCache:
    def __init__(self) -> None:
        self._by_key: dict[bytes, int] = {}
        self._by_block: dict[int, CachedBlock] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def num_cached(self) -> int:
        return len(self._by_block)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def lookup(self, prev: bytes, key: bytes, token_ids: tuple[int, ...]) -> int | None:
        """Block id holding exactly this (prev, tokens), or None."""
        block = self._by_key.get(key)
        if block is None:
            return None
        entry = self._by_block[block]
        if entry.prev != prev or entry.token_ids != token_ids:
            return None
        return block

    def is_cached(self, block: int) -> bool:
        return block in self._by_block

    def publish(self, block: int, prev: bytes, key: bytes, token_ids: tuple[int, ...]) -> bool:
        """Record a computed full block; False (and no change) if the key or block is taken."""
        if key in self._by_key or block in self._by_block:
            return False
        self._by_key[key] = block
        self._by_block[block] = CachedBlock(key, prev, token_ids)
        return True

    def release(self, block: int) -> None:
        """The last reference to a cached block went away: it becomes evictable (MRU end)."""
        self._evictable[block] = None

    def reacquire(self, block: int) -> None:
        """A hit on an evictable block: it is referenced again, no longer evictable."""
        self._evictable.pop(block, None)

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def pop_lru(self) -> int | None:
        """Forget the least recently released evictable block; return its id (None if none)."""
        if not self._evictable:
            return None
        block, _ = self._evictable.popitem(last=False)
        entry = self._by_block.pop(block)
        del self._by_key[entry.key]
        return block
