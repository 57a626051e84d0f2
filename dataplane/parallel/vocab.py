"""Vocab-parallel embedding and LM head (Megatron): each rank holds a contiguous vocab part.

Rank j owns token ids ``[j*P, min((j+1)*P, V))`` with ``P = ceil(V/N)``; the last part is
zero-padded to P rows so every rank's tensors have one shape (padding never reaches an
output: its embedding rows are never selected and its logits are cut off).

Embedding: each rank looks up the ids it owns (others give zero rows), one all-reduce
    sums the parts -> ``[T, hidden]`` replicated.
LM head: each rank computes its logit columns, one all-gather -> ``[T, V]`` float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.errors import ShardShapeError


def vocab_part(vocab_size: int, tp_rank: int, tp_size: int) -> tuple[int, int, int]:
    """(start, stop, padded part size P) of rank `tp_rank`'s token ids."""
    part = -(-vocab_size // tp_size)
    start = min(tp_rank * part, vocab_size)
    return start, min(start + part, vocab_size), part


def shard_vocab_weight(weight: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of a ``[V, hidden]`` table, zero-padded to P rows."""
    if weight.dim() != 2:
        raise ShardShapeError(f"vocab weight must be [V, hidden], got {list(weight.shape)}")
    start, stop, part = vocab_part(weight.shape[0], tp_rank, tp_size)
    out = torch.zeros(part, weight.shape[1], dtype=weight.dtype, device=weight.device)
    out[: stop - start] = weight[start:stop]
    return out


class VocabParallelEmbedding(nn.Module):
    """ids ``[T]`` int64 -> ``[T, hidden]``, replicated after one base all-reduce."""

    def __init__(self, group: TPGroup, vocab_size: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.group, self.vocab_size = group, vocab_size
        self.start, self.stop, part = vocab_part(vocab_size, group.rank, group.size)
        self.weight = nn.Parameter(torch.zeros(part, hidden, dtype=dtype, device=group.device),
                                   requires_grad=False)

    def load_global_weight(self, weight: torch.Tensor) -> None:
        if weight.shape[0] != self.vocab_size or weight.shape[1] != self.weight.shape[1]:
            raise ShardShapeError(f"embedding {list(weight.shape)} != [{self.vocab_size}, "
                                  f"{self.weight.shape[1]}]")
        with torch.no_grad():
            self.weight.copy_(shard_vocab_weight(weight, self.group.rank, self.group.size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mine = (ids >= self.start) & (ids < self.stop)
        local = torch.where(mine, ids - self.start, 0)
        h = F.embedding(local, self.weight)
        h = h * mine.unsqueeze(-1).to(h.dtype)
        return self.group.all_reduce(h.contiguous(), purpose="base")


class ParallelLMHead(nn.Module):
    """hidden ``[T, hidden]`` -> float32 logits ``[T, V]`` gathered on every rank."""

    def __init__(self, group: TPGroup, vocab_size: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.group, self.vocab_size = group, vocab_size
        _, _, part = vocab_part(vocab_size, group.rank, group.size)
        self.weight = nn.Parameter(torch.zeros(part, hidden, dtype=dtype, device=group.device),
                                   requires_grad=False)

    def load_global_weight(self, weight: torch.Tensor) -> None:
        if weight.shape[0] != self.vocab_size or weight.shape[1] != self.weight.shape[1]:
            raise ShardShapeError(f"LM head {list(weight.shape)} != [{self.vocab_size}, "
                                  f"{self.weight.shape[1]}]")
        with torch.no_grad():
            self.weight.copy_(shard_vocab_weight(weight, self.group.rank, self.group.size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = F.linear(hidden, self.weight).float().contiguous()
        parts = self.group.all_gather(local, purpose="base")  # [N, T, P]
        t = hidden.shape[0]
        return parts.permute(1, 0, 2).reshape(t, -1)[:, : self.vocab_size]
