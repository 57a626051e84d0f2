"""Prefix-cache keys: a hash chain over full KV blocks, rooted in the cache ABI (DESIGN §3).

A block's key covers everything that determines its K/V rows and nothing that does not:

    root   = SHA256(canonical JSON {schema, cache_abi, execution, namespace})
    key_0  = SHA256(b"blk" || root   || int64le(tokens of block 0))
    key_i  = SHA256(b"blk" || key_i-1 || int64le(tokens of block i))

`execution` is the adapter's semantic digest for adapter requests and the base digest for
base requests (conservative closure: any adapted module changes downstream K/V, so an
adapter request never shares with base or with another adapter, even at position 0). Never
in a key: request id, adapter alias or name, slot, block ids, sampling policy.

Positions are implied by the chain (block i covers positions [i*bs, (i+1)*bs)).
aLoRA (seed §0x08H): `execution_for_block` keys a block wholly before the activation
position with the base digest, so several adapters share it; the engine does not use it yet
(it needs per-row adapter activation in the model), so every request keys with
active_from = 0 today.

Canonical encoding: JSON with sorted keys and no whitespace over str/int values only (equal
to RFC 8785 for these values). dataplane/identity.py did not exist when this was written;
switch to its canonical helper once it lands.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX_SCHEMA = "adapterplane.prefix-cache.v1"


@dataclass(frozen=True)
class CacheABI:
    """What makes K/V rows of the same tokens interchangeable on one engine.

    `base_digest` is H_base; `kv_dtype`, `block_size` and `layout` describe the physical cache
    (a different dtype or layout never shares). Built once per engine.
    """

    base_digest: str
    kv_dtype: str
    block_size: int
    layout: str = "paged-kv-v1"

    def record(self) -> dict[str, str | int]:
        return {"base_digest": self.base_digest, "kv_dtype": self.kv_dtype,
                "block_size": self.block_size, "layout": self.layout}


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def execution_for_block(abi: CacheABI, adapter_digest: str | None, block_end: int,
                        active_from: int = 0) -> dict[str, str]:
    """Execution identity of a block ending (exclusive) at token position `block_end`."""
    if adapter_digest is None or block_end <= active_from:
        return {"kind": "base", "digest": abi.base_digest}
    return {"kind": "adapter", "digest": adapter_digest}


def chain_root(abi: CacheABI, execution: dict[str, str], namespace: str) -> bytes:
    return hashlib.sha256(_canonical({
        "schema": PREFIX_SCHEMA, "cache_abi": abi.record(),
        "execution": execution, "namespace": namespace,
    })).digest()


def block_key(prev: bytes, token_ids: Sequence[int]) -> bytes:
    """Key of one full block given the previous key (or the root) and its token ids."""
    h = hashlib.sha256(b"blk")
    h.update(prev)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


def chain_keys(abi: CacheABI, token_ids: Sequence[int], *, adapter_digest: str | None,
               namespace: str = "", start: int = 0, stop: int | None = None,
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
        execution = execution_for_block(abi, adapter_digest, (i + 1) * bs, active_from)
        if i == 0 or execution != execution_for_block(abi, adapter_digest, i * bs, active_from):
            root = chain_root(abi, execution, namespace)
            prev = hashlib.sha256(root + prev).digest() if i > 0 else root
        key = block_key(prev, token_ids[i * bs:(i + 1) * bs])
        out.append((prev, key))
        prev = key
    return out
