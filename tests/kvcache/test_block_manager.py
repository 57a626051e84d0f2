"""Block manager + prefix cache: nano-vllm verbs, ref counts, keys by semantic digest."""

from __future__ import annotations

import hashlib
import struct

import pytest

from dataplane import identity
from dataplane.core import InvalidRequest, Sequence
from dataplane.kvcache import (
    BlockManager,
    CacheABI,
    FreeListPagePool,
    InvalidCacheABI,
    PageKind,
    PoolExhausted,
    PrefixCache,
    chain_keys,
)

BS = 4


def D(name: str) -> str:
    """A stand-in semantic digest (64 hex) named for readability."""
    return hashlib.sha256(name.encode()).hexdigest()


ABI = CacheABI(base_digest=D("base"), kv_dtype="float32", block_size=BS)


def _mgr(pages: int = 16) -> tuple[BlockManager, FreeListPagePool]:
    pool = FreeListPagePool(pages)
    return BlockManager(pool, ABI), pool


def _seq(rid: str, tokens: list[int], digest: str | None = None, slot: int = 0,
         ns: str = "default") -> Sequence:
    return Sequence(rid, tuple(tokens), adapter_slot=slot if digest else -1,
                    adapter_digest=None if digest is None else D(digest),
                    isolation_namespace=ns)


def _computed(mgr: BlockManager, seq: Sequence) -> None:
    """What the scheduler does after a step computed every token but the last."""
    seq.num_computed_tokens = seq.num_tokens
    mgr.cache_computed_blocks(seq)


def _conserved(mgr: BlockManager, pool: FreeListPagePool) -> None:
    assert pool.num_used(PageKind.KV) == mgr.num_held_blocks
    assert pool.num_free + pool.num_used(PageKind.KV) == pool.num_pages


def test_allocate_append_deallocate_counts() -> None:
    mgr, pool = _mgr(4)
    seq = _seq("r", list(range(5)))  # 2 blocks
    assert mgr.can_allocate(seq)
    mgr.allocate(seq)
    assert len(seq.block_table) == 2 and pool.num_free == 2
    assert all(mgr.ref_count(b) == 1 for b in seq.block_table)
    for t in (5, 6, 7):  # positions 5..7 fit in block 1
        seq.token_ids.append(t)
        assert mgr.blocks_needed(seq) == 0
    seq.token_ids.append(8)  # position 8 starts block 2
    assert mgr.blocks_needed(seq) == 1 and mgr.can_append(seq)
    mgr.may_append(seq)
    assert len(seq.block_table) == 3 and pool.num_free == 1
    _conserved(mgr, pool)
    mgr.deallocate(seq)
    assert seq.block_table == [] and pool.num_free == 4
    _conserved(mgr, pool)


def test_allocate_exhausted_changes_nothing() -> None:
    mgr, pool = _mgr(2)
    seq = _seq("r", list(range(9)))  # 3 blocks
    assert not mgr.can_allocate(seq)
    with pytest.raises(PoolExhausted):
        mgr.allocate(seq)
    assert seq.block_table == [] and pool.num_free == 2


def test_prefix_hit_same_digest_across_requests() -> None:
    mgr, pool = _mgr()
    prompt = list(range(100, 111))  # 11 tokens: 2 full blocks + 3
    a = _seq("a", prompt, "sem-1", slot=3)
    mgr.allocate(a)
    assert a.num_cached_tokens == 0
    _computed(mgr, a)
    b = _seq("b", [*prompt[:8], 7, 7], "sem-1", slot=5)  # other slot, same semantic digest
    mgr.allocate(b)
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert [mgr.ref_count(x) for x in b.block_table] == [2, 2, 1]
    _conserved(mgr, pool)


@pytest.mark.parametrize(
    "other",
    [
        dict(digest="sem-2"),  # another adapter
        dict(digest=None),  # base
        dict(digest="sem-1", ns="tenant-b"),  # another isolation namespace
    ],
)
def test_prefix_miss_across_execution_identity(other: dict[str, str | None]) -> None:
    mgr, _ = _mgr()
    prompt = list(range(12))
    a = _seq("a", prompt, "sem-1")
    mgr.allocate(a)
    _computed(mgr, a)
    b = _seq("b", prompt, other["digest"], ns=other.get("ns") or "default")
    mgr.allocate(b)
    assert b.num_cached_tokens == 0
    assert not set(a.block_table) & set(b.block_table)


def test_base_requests_share_with_base() -> None:
    mgr, _ = _mgr()
    a = _seq("a", list(range(9)))
    mgr.allocate(a)
    _computed(mgr, a)
    b = _seq("b", list(range(9)))
    mgr.allocate(b)
    assert b.num_cached_tokens == 8


def test_last_token_never_served_from_cache() -> None:
    mgr, _ = _mgr()
    a = _seq("a", list(range(8)), "d")  # exactly 2 full blocks
    mgr.allocate(a)
    _computed(mgr, a)
    b = _seq("b", list(range(8)), "d")
    mgr.allocate(b)
    assert b.num_cached_tokens == 4  # block 1 holds the last token: recomputed privately
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_uncomputed_blocks_are_not_published() -> None:
    mgr, _ = _mgr()
    a = _seq("a", list(range(12)), "d")
    mgr.allocate(a)
    a.num_computed_tokens = 4  # one chunk computed
    mgr.cache_computed_blocks(a)
    b = _seq("b", list(range(12)), "d")
    mgr.allocate(b)
    assert b.num_cached_tokens == 4


def test_freed_cached_blocks_are_reused_then_evicted_lru() -> None:
    mgr, pool = _mgr(4)
    a = _seq("a", list(range(9)), "d")  # 3 blocks, 2 full publishable
    mgr.allocate(a)
    _computed(mgr, a)
    a_blocks = list(a.block_table)
    mgr.deallocate(a)
    assert mgr.cache.num_evictable == 2 and pool.num_free == 2 and mgr.num_free_blocks == 4
    again = _seq("a2", list(range(9)), "d")
    mgr.allocate(again)  # hits both cached blocks
    assert again.num_cached_tokens == 8 and again.block_table[:2] == a_blocks[:2]
    mgr.deallocate(again)
    # A 3-block request takes the 2 free pages, then recycles the LRU cached block: the tail
    # block (released first), so the head block stays cached and still hits.
    other = _seq("other", list(range(50, 59)), "other")
    mgr.allocate(other)
    assert a_blocks[1] in other.block_table and a_blocks[0] not in other.block_table
    assert mgr.cache.num_cached == 1
    mgr.deallocate(other)  # never computed: its pages go straight back to the pool
    head = _seq("head", [0, 1, 2, 3, 99], "d")
    assert mgr.can_allocate(head)
    mgr.allocate(head)
    assert head.num_cached_tokens == 4 and head.block_table[0] == a_blocks[0]
    _conserved(mgr, pool)


def test_evict_returns_cached_pages_to_pool() -> None:
    mgr, pool = _mgr(4)
    a = _seq("a", list(range(9)))
    mgr.allocate(a)
    _computed(mgr, a)
    mgr.deallocate(a)
    assert mgr.evict(5) == 2
    assert pool.num_free == 4 and mgr.num_held_blocks == 0
    _conserved(mgr, pool)


def test_hit_is_verified_against_stored_tokens() -> None:
    cache = PrefixCache()
    assert cache.publish(7, b"p", b"k", (1, 2, 3, 4))
    assert cache.lookup(b"p", b"k", (1, 2, 3, 4)) == 7
    assert cache.lookup(b"p", b"k", (1, 2, 3, 5)) is None  # forged/colliding key
    assert cache.lookup(b"q", b"k", (1, 2, 3, 4)) is None
    assert not cache.publish(8, b"p", b"k", (1, 2, 3, 4))  # key taken: no change
    assert cache.num_cached == 1


def test_chain_keys_match_independent_spec() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    abi = identity.CacheABI(D("base"), D("sem"), "float32", 4)
    root = bytes.fromhex(identity.prefix_key(abi.sha256, [], isolation_namespace="acme"))
    k0 = hashlib.sha256(b"blk" + root + struct.pack("<4q", 5, 6, 7, 8)).digest()
    k1 = hashlib.sha256(b"blk" + k0 + struct.pack("<4q", 9, 10, 11, 12)).digest()
    got = chain_keys(ABI, tokens, adapter_digest=D("sem"), namespace="acme")
    assert got == [(root, k0), (k0, k1)]


def test_invalid_identities_are_typed_errors() -> None:
    with pytest.raises(InvalidCacheABI) as exc:
        CacheABI(base_digest="not-a-digest", kv_dtype="float32", block_size=4)
    assert exc.value.code == "INVALID_CACHE_ABI"
    mgr, _ = _mgr()
    bad = Sequence("bad", (1, 2), adapter_slot=0, adapter_digest="alias-name")
    with pytest.raises(InvalidRequest):
        mgr.check_request(bad, 4)


def test_alora_blocks_before_activation_share_base_identity() -> None:
    tokens = list(range(12))
    base = chain_keys(ABI, tokens, adapter_digest=None, namespace="ns")
    x = chain_keys(ABI, tokens, adapter_digest=D("x"), namespace="ns", active_from=6)
    y = chain_keys(ABI, tokens, adapter_digest=D("y"), namespace="ns", active_from=6)
    assert x[0] == y[0] == base[0]  # block [0,4) wholly before activation at 6
    assert x[1] != y[1] and x[1] != base[1]  # block [4,8) touches activation: adapter-keyed
    assert x[2] != y[2]
