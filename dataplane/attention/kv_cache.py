"""Paged KV storage: per layer, K and V as flat slot arrays `[num_blocks * block_size + 1, Hkv, D]`.

KV slot `block_id * block_size + offset` holds the K/V of one token (block ids come from the
runtime's block manager). The extra last slot is a *trash slot*: padded rows of a
CUDA-graph batch write their K/V there and read only it, so padding never touches a
request's blocks.
"""

from __future__ import annotations

import torch


class PagedKVCache:
    """K and V tensors for every layer. Shapes: `k[l]`, `v[l]` = [num_slots + 1, Hkv, D]."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_slots = num_blocks * block_size
        shape = (num_layers, self.num_slots + 1, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def trash_slot(self) -> int:
        return self.num_slots

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Store k, v [T, Hkv, D] at slots slot_mapping [T] (int64) of `layer`."""
        self.k[layer].index_copy_(0, slot_mapping, k)
        self.v[layer].index_copy_(0, slot_mapping, v)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
