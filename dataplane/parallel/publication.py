"""All-ranks-validate publication of an adapter generation.

"Every rank publishes a generation only when all ranks have validated it": a rank that
published early would let one request see a mixed adapter generation across shards.

Protocol (one collective, every rank decides from the same votes, so all decide alike):
    1. each rank digests its local shard and compares with the expected shard digest
       (`validate_local_shard`);
    2. one all-gather of (ok, generation, contract digest, shard digest, H_kernel_local)
       from every rank;
    3. publish iff every rank is ok and all ranks name the same generation and the same
       global contract digest (semantic adapter + TP plan); otherwise every rank rolls
       back its staged shard. Shard digests and H_kernel_local (the rank's shard layout,
       `layout_identity.tp_kernel_local_identity`) differ per rank by design; they are
       returned so the publication record can bind each rank's shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dataplane.identity import check_digest
from dataplane.parallel.collectives import TPGroup

_WORDS = 4  # a SHA-256 digest as 4 int64 words
NO_IDENTITY = "0" * 64
"""The H_kernel_local a vote carries when there is none (a clear, or no specs)."""


@dataclass(frozen=True)
class RankVote:
    rank: int
    ok: bool
    generation: int
    contract_digest: str
    shard_digest: str
    kernel_local: str = NO_IDENTITY


@dataclass(frozen=True)
class PublicationOutcome:
    published: bool
    reason: str
    votes: tuple[RankVote, ...]


def shard_digest(tensors: Sequence[torch.Tensor]) -> str:
    """SHA-256 over (dtype, shape, raw bytes) of each tensor in order."""
    h = hashlib.sha256()
    for t in tensors:
        c = t.detach().to("cpu").contiguous()
        h.update(f"{c.dtype}|{list(c.shape)}|".encode())
        h.update(c.view(torch.uint8).numpy().tobytes() if c.numel() else b"")
    return h.hexdigest()


def validate_local_shard(tensors: Sequence[torch.Tensor], expected_digest: str
                         ) -> tuple[bool, str]:
    """(digest matches, actual digest) of this rank's staged shard."""
    actual = shard_digest(tensors)
    return actual == check_digest(expected_digest, "expected_digest"), actual


def _words(hex_digest: str) -> list[int]:
    raw = bytes.fromhex(check_digest(hex_digest, "digest"))
    return [int.from_bytes(raw[i * 8:(i + 1) * 8], "little", signed=True) for i in range(_WORDS)]


def _hex(words: Sequence[int]) -> str:
    return b"".join(int(w).to_bytes(8, "little", signed=True) for w in words).hex()


def publish_when_all_valid(group: TPGroup, *, generation: int, contract_digest: str,
                           local_ok: bool, local_shard_digest: str,
                           publish: Callable[[], None], rollback: Callable[[], None],
                           local_kernel_local: str = NO_IDENTITY) -> PublicationOutcome:
    """Run steps 2–3 of the protocol; calls exactly one of `publish` / `rollback`."""
    vote = torch.tensor([int(local_ok), generation, *_words(contract_digest),
                         *_words(local_shard_digest), *_words(local_kernel_local)],
                        dtype=torch.int64, device=group.device)
    rows = group.all_gather(vote, purpose="control").cpu().tolist()
    votes = tuple(RankVote(rank=j, ok=bool(r[0]), generation=int(r[1]),
                           contract_digest=_hex(r[2:2 + _WORDS]),
                           shard_digest=_hex(r[2 + _WORDS:2 + 2 * _WORDS]),
                           kernel_local=_hex(r[2 + 2 * _WORDS:2 + 3 * _WORDS]))
                  for j, r in enumerate(rows))
    failed = [v.rank for v in votes if not v.ok]
    if failed:
        reason = f"ranks {failed} failed shard validation"
    elif len({v.generation for v in votes}) != 1:
        reason = "ranks disagree on the generation"
    elif len({v.contract_digest for v in votes}) != 1:
        reason = "ranks disagree on the contract digest"
    else:
        publish()
        return PublicationOutcome(True, "all ranks validated", votes)
    rollback()
    return PublicationOutcome(False, reason, votes)
