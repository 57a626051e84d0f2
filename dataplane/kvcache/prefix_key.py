"""Prefix-cache keys: a hash chain over full KV blocks, rooted in the cache ABI.

A block's key covers everything that determines its K/V rows and nothing that does not
(docs/ARCHITECTURE.md, "Identities"):

    root   = identity.prefix_key(identity.CacheABI(h_base, semantic | None, kv_dtype,
                                                   block_tokens, tp shard).sha256,
                                 [], isolation_namespace)   # the key of the empty prefix
    key_0  = SHA256(b"blk" || root    || int64le(tokens of block 0))
    key_i  = SHA256(b"blk" || key_i-1 || int64le(tokens of block i))

The execution identity is the adapter's semantic digest for adapter requests and None (base
digest only) for base requests — conservative closure: any adapted module changes downstream
K/V, so an adapter request never shares with base or with another adapter, even at position
0. Never in a key: request id, adapter alias or name, slot, block ids, sampling policy.
Positions are implied by the chain (block i covers positions [i*bs, (i+1)*bs)).

Activated LoRA (aLoRA): `execution_digest` keys a block wholly before the request's
activation position (`Sequence.active_from`, engine/activation.py) with the base identity:
those rows ran as base rows, so the base model and every aLoRA of the base share the block.
A block containing or after the activation position is keyed by the adapter, so reuse
stops at the last full block before it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from dataplane import identity
from dataplane.kvcache.errors import InvalidCacheABI


@dataclass(frozen=True)
class CacheABI:
    """The engine-wide fields of `identity.CacheABI` (all but the execution identity).

    `base_digest` is H_base (64 hex); `kv_dtype`, `block_size` and the TP shard describe the
    K/V representation. Built once per engine; validated on construction.
    """

    base_digest: str
    kv_dtype: str
    block_size: int
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        self.execution(None)

    def execution(self, adapter_digest: str | None) -> identity.CacheABI:
        """The full cache ABI of rows produced under `adapter_digest` (None: base only)."""
        try:
            return identity.CacheABI(self.base_digest, adapter_digest, self.kv_dtype,
                                     self.block_size, self.tp_rank, self.tp_size)
        except identity.IdentityError as exc:
            raise InvalidCacheABI(exc.message, identity_code=exc.code) from exc


def execution_digest(adapter_digest: str | None, block_end: int, active_from: int = 0
                     ) -> str | None:
    """Execution identity of a block ending (exclusive) at token position `block_end`."""
    return None if adapter_digest is None or block_end <= active_from else adapter_digest


@lru_cache(maxsize=4096)
def chain_root(abi: CacheABI, adapter_digest: str | None, namespace: str) -> bytes:
    """Key of the empty prefix under one execution identity and isolation namespace."""
    abi_sha = abi.execution(adapter_digest).sha256
    try:
        return bytes.fromhex(identity.prefix_key(abi_sha, [], isolation_namespace=namespace))
    except identity.IdentityError as exc:
        raise InvalidCacheABI(exc.message, identity_code=exc.code) from exc


def block_key(prev: bytes, token_ids: Sequence[int]) -> bytes:
    """Key of one full block given the previous key (or the root) and its token ids."""
    h = hashlib.sha256(b"blk")
    h.update(prev)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


def chain_keys(abi: CacheABI, token_ids: Sequence[int], *, adapter_digest: str | None,
               namespace: str, start: int = 0, stop: int | None = None,
               prev: bytes = b"", active_from: int = 0) -> list[tuple[bytes, bytes]]:
    """(prev, key) of full blocks [start, stop) of `token_ids`; `prev` = key of block start-1.

    `stop` defaults to the number of full blocks. Where the execution identity switches from
    base to adapter at a block boundary (aLoRA) the chain is re-rooted in the adapter identity
    *and* the previous key, so an adapted block is never shared across adapters even where
    its base prefix is.
    """
    bs = abi.block_size
    full = len(token_ids) // bs
    stop = full if stop is None else min(stop, full)
    out: list[tuple[bytes, bytes]] = []
    for i in range(start, stop):
        execution = execution_digest(adapter_digest, (i + 1) * bs, active_from)
        if i == 0 or execution != execution_digest(adapter_digest, i * bs, active_from):
            root = chain_root(abi, execution, namespace)
            prev = hashlib.sha256(root + prev).digest() if i > 0 else root
        key = block_key(prev, token_ids[i * bs:(i + 1) * bs])
        out.append((prev, key))
        prev = key
    return out
