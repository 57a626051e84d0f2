"""The prefix-cache keys of activated LoRA: the mid-request switch table and the
adapter/KV failure rows, on the four-token fixture [11, 12, 99, 100] with invocation
[99, 100] (activation at position 2) and one-token blocks, so that "reusable K/V" is the
number of leading blocks two requests' key chains share."""

from __future__ import annotations

import hashlib

from dataplane import identity
from dataplane.engine.activation import activation_offset
from dataplane.kvcache import CacheABI, chain_keys

TOKENS = [11, 12, 99, 100]
INVOKE = [99, 100]


def D(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


ABI = CacheABI(base_digest=D("base"), kv_dtype="float32", block_size=1)


def semantic(artifact: str, invocation: list[int] | None) -> str:
    """The semantic digest the engine keys an adapter's rows by."""
    return identity.h_adapter_semantic(D("base"), D(artifact),
                                       identity.activation_policy_sha256(invocation))


def keys(adapter: str | None, active_from: int = 0, namespace: str = "ns",
         tokens: list[int] = TOKENS) -> list[bytes]:
    return [k for _, k in chain_keys(ABI, tokens, adapter_digest=adapter, namespace=namespace,
                                     active_from=active_from)]


def shared(a: list[bytes], b: list[bytes]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


LORA_A, LORA_B = semantic("lora-a", None), semantic("lora-b", None)
ALORA_A, ALORA_B = semantic("alora-a", INVOKE), semantic("alora-b", INVOKE)
START = activation_offset(TOKENS, INVOKE)


def test_the_fixture_activates_at_the_first_invocation_token() -> None:
    assert START == 2


def test_switch_table() -> None:
    base = keys(None)
    # ordinary LoRA A -> ordinary LoRA B: nothing reusable (adapted from position 0)
    assert shared(keys(LORA_A), keys(LORA_B)) == 0
    assert shared(keys(LORA_A), base) == 0
    # base -> aLoRA A at position 2: the clean base prefix [0, 2)
    assert shared(base, keys(ALORA_A, START)) == 2
    # aLoRA A -> base after position 2: the same clean prefix, never the tainted suffix
    assert shared(keys(ALORA_A, START), base) == 2
    # aLoRA A -> aLoRA B, same boundary: the base prefix only; distinct adapted suffixes
    a, b = keys(ALORA_A, START), keys(ALORA_B, START)
    assert shared(a, b) == 2 and set(a[2:]).isdisjoint(b[2:])
    # the same aLoRA with another boundary: its schedule changes the interval digests
    assert shared(keys(ALORA_A, START), keys(ALORA_A, 1)) == 1


def test_failure_rows_are_closed() -> None:
    base = keys(None)
    # the adapted rows are keyed by the adapter: a base request never hits them, and a
    # base block is never relabelled as an adapter block (or the reverse)
    assert set(keys(ALORA_A, START)[2:]).isdisjoint(base)
    # the same artifact always on (plain LoRA) is another function: no shared rows at all
    assert semantic("alora-a", None) != ALORA_A
    assert shared(keys(semantic("alora-a", None)), keys(ALORA_A, START)) == 0
    # the last exact occurrence decides, not the first
    assert activation_offset([99, 100, 11, 99, 100, 12], INVOKE) == 3
    # lookups are partitioned by namespace before any block is compared
    assert shared(keys(None, namespace="ns"), keys(ALORA_A, START, namespace="other")) == 0


def test_a_boundary_inside_a_block_stops_reuse_at_the_previous_full_block() -> None:
    abi4 = CacheABI(base_digest=D("base"), kv_dtype="float32", block_size=4)
    tokens = list(range(20, 32))
    base = [k for _, k in chain_keys(abi4, tokens, adapter_digest=None, namespace="ns")]
    alora = [k for _, k in chain_keys(abi4, tokens, adapter_digest=ALORA_A, namespace="ns",
                                      active_from=6)]
    assert shared(base, alora) == 1  # block [0, 4) only: [4, 8) holds the boundary
