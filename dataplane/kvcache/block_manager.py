"""KV block manager: block tables, reference counts and prefix reuse (nano-vllm verbs).

Torch-free. Every KV page this manager holds came from the `PagePool` under `PageKind.KV` and
is either referenced by >= 1 sequence's block table or, with zero references, cached and
evictable in the prefix cache. Invariant: pool.num_used(KV) == number of pages held here.

Allocation covers the sequence's current tokens at admission (`allocate`); decode growth goes
through `can_append` / `may_append`. After a step computes K/V, `cache_computed_blocks`
publishes the sequence's newly full computed blocks. The last token of a sequence is never
served from the cache, so at least one row is always computed and sampled, and the block it
writes into is private to the sequence.
"""

from __future__ import annotations

from dataplane.core import InvalidRequest, Sequence
from dataplane.kvcache.errors import (
    InvalidCacheABI,
    InvalidPageOperation,
    KVCapacityError,
    PoolExhausted,
)
from dataplane.kvcache.page_pool import PageKind, PagePool
from dataplane.kvcache.prefix_cache import PrefixCache
from dataplane.kvcache.prefix_key import CacheABI, chain_keys, chain_root


class BlockManager:
    def __init__(self, pool: PagePool, abi: CacheABI, *, enable_prefix_caching: bool = True
                 ) -> None:
        self.pool = pool
        self.abi = abi
        self.block_size = abi.block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.cache = PrefixCache()
        self._refs: dict[int, int] = {}  # every held page -> reference count
        self._chains: dict[str, list[tuple[bytes, bytes]]] = {}  # request -> (prev, key) per block
        self._published: dict[str, int] = {}  # request -> blocks already offered to the cache

    # ----- capacity -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks obtainable now: free pool pages plus evictable cached blocks."""
        return self.pool.num_free + self.cache.num_evictable

    def can_take(self, n: int) -> bool:
        """`n <= num_free_blocks`, asked of the pool as `can_allocate`: a pool whose free
        count is costly (the agent's unified pool adds the pages of idle adapters it could
        evict, a scan of every resident) answers the common case, enough free pages, at
        once. The scheduler asks this for every sequence that grows a block."""
        return self.pool.can_allocate(max(0, n - self.cache.num_evictable))

    @property
    def num_held_blocks(self) -> int:
        return len(self._refs)

    def ref_count(self, block: int) -> int:
        return self._refs.get(block, 0)

    def blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def check_request(self, seq: Sequence, max_tokens: int) -> None:
        """Admission check, before a request is queued: its cache identity is valid
        (InvalidRequest) and `max_tokens` tokens fit an empty pool (KVCapacityError)."""
        try:
            chain_root(self.abi, seq.adapter_digest, seq.isolation_namespace)
        except InvalidCacheABI as exc:
            raise InvalidRequest(f"request has no valid cache identity: {exc.message}",
                                 request_id=seq.request_id) from exc
        need = self.blocks_for(max_tokens)
        if need > self.pool.num_pages:
            raise KVCapacityError("request needs more KV blocks than the pool has",
                                  request_id=seq.request_id, blocks=need,
                                  pool_pages=self.pool.num_pages)

    # ----- prefix lookup ----------------------------------------------------------------
    def _chain(self, seq: Sequence, num_blocks: int) -> list[tuple[bytes, bytes]]:
        chain = self._chains.setdefault(seq.request_id, [])
        if len(chain) < num_blocks:
            prev = chain[-1][1] if chain else b""
            chain.extend(chain_keys(self.abi, seq.token_ids, adapter_digest=seq.adapter_digest,
                                    namespace=seq.isolation_namespace, start=len(chain),
                                    stop=num_blocks, prev=prev, active_from=seq.active_from))
        return chain[:num_blocks]

    def _lookup(self, seq: Sequence) -> list[int]:
        """Verified cached blocks for the longest cached prefix (never the last token's block);
        none for a request that scores its prompt (prompt logprobs need every row)."""
        if not self.enable_prefix_caching or seq.sampling.prompt_logprobs is not None:
            return []
        bs = self.block_size
        chain = self._chain(seq, (seq.num_tokens - 1) // bs)
        hits: list[int] = []
        for i, (prev, key) in enumerate(chain):
            block = self.cache.lookup(prev, key, tuple(seq.token_ids[i * bs:(i + 1) * bs]))
            if block is None:
                break
            hits.append(block)
        return hits

    # ----- allocation -------------------------------------------------------------------
    def _take(self, n: int) -> list[int]:
        """n held-by-us pages: free pool pages first, then recycled LRU cached blocks, and
        only then pages the pool frees by evicting idle adapters (a unified pool): a
        cached block nobody holds is cheaper to lose than an adapter a request may want."""
        pages = self.pool.allocate(min(n, self.pool.num_free_pages), PageKind.KV)
        while len(pages) < n:
            block = self.cache.pop_lru()
            if block is None:
                break
            del self._refs[block]
            pages.append(block)
        if len(pages) < n:
            rest = n - len(pages)
            if not self.pool.can_allocate(rest):  # callers check capacity first
                self.pool.free(pages, PageKind.KV)
                raise PoolExhausted("no free or evictable KV blocks", requested=n)
            pages += self.pool.allocate(rest, PageKind.KV)
        for p in pages:
            self._refs[p] = 0
        return pages

    def _needs(self, seq: Sequence, hits: list[int]) -> int:
        """Obtainable blocks that allocate() would consume (new blocks + evictable hits)."""
        new = self.blocks_for(seq.num_tokens) - len(hits)
        return new + sum(1 for b in hits if self.cache.is_evictable(b))

    def can_allocate(self, seq: Sequence, keep: int = 0) -> bool:
        """allocate(seq) would succeed and leave at least `keep` blocks obtainable."""
        return self.can_take(self._needs(seq, self._lookup(seq)) + keep)

    def allocate(self, seq: Sequence) -> None:
        """Give `seq` a block table for all its tokens, reusing verified cached prefix blocks.

        Sets block_table, num_cached_tokens and num_computed_tokens (= cached tokens).
        All or nothing: raises PoolExhausted without changing anything.
        """
        if seq.block_table:
            raise InvalidPageOperation("sequence already has blocks", request_id=seq.request_id)
        hits = self._lookup(seq)
        if not self.can_take(self._needs(seq, hits)):
            raise PoolExhausted("not enough KV blocks", request_id=seq.request_id,
                                free=self.num_free_blocks)
        for b in hits:
            self.cache.reacquire(b)
            self._refs[b] += 1
        fresh = self._take(self.blocks_for(seq.num_tokens) - len(hits))
        for b in fresh:
            self._refs[b] = 1
        seq.block_table = hits + fresh
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        self._published[seq.request_id] = len(hits)

    def blocks_needed(self, seq: Sequence) -> int:
        """New blocks `seq` needs so its table covers all of its tokens."""
        return max(0, self.blocks_for(seq.num_tokens) - len(seq.block_table))

    def can_append(self, seq: Sequence) -> bool:
        return self.can_take(self.blocks_needed(seq))

    def may_append(self, seq: Sequence) -> None:
        """Grow the block table to cover every token of `seq` (PoolExhausted: no change)."""
        need = self.blocks_needed(seq)
        if not self.can_take(need):
            raise PoolExhausted("not enough KV blocks", request_id=seq.request_id,
                                free=self.num_free_blocks)
        fresh = self._take(need)
        for b in fresh:
            self._refs[b] = 1
        seq.block_table.extend(fresh)

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Publish the full blocks of `seq` whose K/V are computed (call after each step)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        done = self._published.get(seq.request_id, 0)
        if full <= done:
            return
        chain = self._chain(seq, full)
        for i in range(done, full):
            prev, key = chain[i]
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            self.cache.publish(seq.block_table[i], prev, key, tokens)
        self._published[seq.request_id] = full

    def deallocate(self, seq: Sequence) -> None:
        """Drop `seq`'s references; unreferenced cached blocks become evictable, others free."""
        to_pool: list[int] = []
        for b in reversed(seq.block_table):  # tail first, so the tail is evicted first
            self._refs[b] -= 1
            if self._refs[b] == 0:
                if self.cache.is_cached(b):
                    self.cache.release(b)
                else:
                    del self._refs[b]
                    to_pool.append(b)
        self.pool.free(to_pool, PageKind.KV)
        seq.block_table = []
        seq.num_computed_tokens = 0  # num_cached_tokens stays: the last admission's hit stat
        self._chains.pop(seq.request_id, None)
        self._published.pop(seq.request_id, None)

    def evict(self, n: int) -> int:
        """Return up to `n` evictable cached blocks to the pool (for other page owners)."""
        freed: list[int] = []
        while len(freed) < n:
            block = self.cache.pop_lru()
            if block is None:
                break
            del self._refs[block]
            freed.append(block)
        self.pool.free(freed, PageKind.KV)
        return len(freed)
