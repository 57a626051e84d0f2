"""Paged KV storage: per layer, K and V addressed by KV *slot* (``block_id * block_size + offset``).

Two layouts, one slot addressing (block ids come from the runtime's block manager):

* **Private, layer-major** (``PagedKVCache(...)``): ``k[l]``, ``v[l]`` are flat slot arrays
  ``[num_blocks * block_size + 1, Hkv, D]`` (contiguous).
* **Page-major, in a caller's buffer** (:meth:`PagedKVCache.in_pages`, the agent's unified
  page pool): ``pages [num_blocks + 1, page_elems]``; page ``p`` holds KV block ``p`` as
  ``[layers][2 (K, V)][block_size][Hkv][D]`` in its first ``kv_block_elems`` elements.
  ``k[l]``, ``v[l]`` are strided views ``[num_blocks + 1, block_size, Hkv, D]`` with
  ``stride(0) == page_elems`` (not ``block_size * Hkv * D``): nothing is copied, and KV
  block ``p``'s bytes are exactly page ``p``'s first ``kv_block_elems`` elements.

The extra last slot (block ``num_blocks``, offset 0 in the page-major layout) is a *trash
slot*: padded rows of a CUDA-graph batch write their K/V there and read only it, so
padding never touches a request's blocks.

Every reader and writer takes either form; :func:`kv_strides`, :func:`gather_slots`,
:func:`gather_blocks` and :func:`write_slots` turn a slot into an address for both.
"""

from __future__ import annotations

import torch

from dataplane.errors import EngineError


class KVCacheLayoutError(EngineError, ValueError):
    """A KV cache tensor or buffer does not have the geometry asked for. Still a
    `ValueError`: `ModelRunner` turns a `ValueError` from `check_geometry` into
    `InvalidRequest`."""

    code = "KV_CACHE_LAYOUT"


def kv_strides(cache: torch.Tensor, block_size: int) -> tuple[int, int, int]:
    """(block stride, token stride, head stride) in elements of one layer's K or V.

    ``cache`` is flat ``[S, Hkv, D]`` (block stride = ``block_size * stride(0)``) or blocked
    ``[B, block_size, Hkv, D]`` (any block stride). The head dim must have unit stride."""
    if cache.dim() == 3 and cache.stride(2) == 1:
        return block_size * cache.stride(0), cache.stride(0), cache.stride(1)
    if cache.dim() == 4 and cache.shape[1] == block_size and cache.stride(3) == 1:
        return cache.stride(0), cache.stride(1), cache.stride(2)
    raise KVCacheLayoutError(f"KV cache {list(cache.shape)} strides {cache.stride()} is "
                             f"neither [S, Hkv, D] nor [B, {block_size}, Hkv, D]")


def is_blocked(cache: torch.Tensor) -> bool:
    """True for the blocked ``[B, block_size, Hkv, D]`` form (page-major views)."""
    return cache.dim() == 4


def gather_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``cache`` rows at int64 ``slots`` (any shape ``[*]``) -> ``[*, Hkv, D]`` (a copy)."""
    if cache.dim() == 4:
        bs = cache.shape[1]
        return cache[slots // bs, slots % bs]
    return cache[slots]


def gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor, block_size: int
                  ) -> torch.Tensor:
    """Whole KV blocks of ``block_tables`` (int64 ``[D, B]``) -> ``[D, B * block_size, Hkv,
    D]`` (a copy): row d's keys in position order. One row gather of whole blocks (each
    block is ``block_size`` contiguous token rows in either layout) instead of one
    element-wise gather per slot: the torch decode path's key read.

    In the private layout the trash slot is a single row, not a whole block: the trash
    block id (which only graph padding rows name) reads the last whole block instead,
    and a padding row's output is never used."""
    d, b = block_tables.shape
    ids = block_tables.reshape(-1)
    if cache.dim() == 4:
        blocks = cache
    else:
        usable = cache.shape[0] // block_size * block_size
        blocks = cache[:usable].view(-1, block_size, *cache.shape[1:])
        ids = ids.clamp(max=blocks.shape[0] - 1)
    rows = blocks.index_select(0, ids)
    return rows.view(d, b * block_size, *cache.shape[-2:])


def write_slots(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """``cache[slot[t]] = x[t]`` for int64 ``slots [T]``, ``x [T, Hkv, D]``."""
    if cache.dim() == 4:
        bs = cache.shape[1]
        cache.index_put_((slots // bs, slots % bs), x.to(cache.dtype))
    else:
        cache.index_copy_(0, slots, x)


class PagedKVCache:
    """K and V tensors for every layer (module docstring).

    Private: ``k``, ``v`` = ``[layers, num_slots + 1, Hkv, D]``. Page-major
    (:meth:`in_pages`): ``k``, ``v`` = ``[layers, num_blocks + 1, block_size, Hkv, D]`` views
    of ``pages``. Either way ``k[l]`` is what the kernels take for layer ``l``."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device,
                 *, _views: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                 ) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_slots = num_blocks * block_size
        self.pages: torch.Tensor | None = None
        """The caller's page buffer (page-major layout) or None (private layout)."""
        if _views is not None:
            self.pages, self.k, self.v = _views
            return
        shape = (num_layers, self.num_slots + 1, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @classmethod
    def in_pages(cls, pages: torch.Tensor, num_layers: int, block_size: int,
                 num_kv_heads: int, head_dim: int) -> PagedKVCache:
        """Views into ``pages [num_blocks + 1, page_elems]`` (row stride ``page_elems``,
        unit inner stride, ``page_elems >= kv_block_elems``); the last page is the trash
        block. The cache's dtype and device are the buffer's; it allocates nothing."""
        dims = (num_layers, block_size, num_kv_heads, head_dim)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
            raise KVCacheLayoutError(f"bad KV dims {dims}")
        tok = num_kv_heads * head_dim
        half = block_size * tok
        if pages.dim() != 2 or pages.shape[0] < 2 or pages.stride(1) != 1 \
                or pages.shape[1] < 2 * num_layers * half or pages.stride(0) < pages.shape[1]:
            raise KVCacheLayoutError(
                f"page buffer {list(pages.shape)} strides {pages.stride()} cannot hold "
                f"{2 * num_layers * half}-element KV blocks plus a trash page")
        n = pages.shape[0] - 1
        shape = (num_layers, n + 1, block_size, num_kv_heads, head_dim)
        strides = (2 * half, pages.stride(0), tok, head_dim, 1)
        k = pages.as_strided(shape, strides, pages.storage_offset())
        v = pages.as_strided(shape, strides, pages.storage_offset() + half)
        return cls(num_layers, n, block_size, num_kv_heads, head_dim, pages.dtype,
                   pages.device, _views=(pages, k, v))

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def trash_slot(self) -> int:
        return self.num_slots

    def check_geometry(self, num_layers: int, num_blocks: int, block_size: int,
                       num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                       device: torch.device) -> None:
        """Raise :class:`KVCacheLayoutError` unless this cache has exactly this geometry."""
        want = (num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype,
                torch.device(device))
        have = (self.num_layers, self.num_blocks, self.block_size, self.num_kv_heads,
                self.head_dim, self.dtype, self.device)
        if want[:6] != have[:6] or want[6].type != have[6].type or (
                want[6].index is not None and have[6].index is not None
                and want[6].index != have[6].index):
            raise KVCacheLayoutError(f"KV cache (layers, blocks, block_size, kv_heads, "
                                     f"head_dim, dtype, device) is {have}, expected {want}")

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Store k, v [T, Hkv, D] at slots slot_mapping [T] (int64) of `layer`."""
        write_slots(self.k[layer], slot_mapping, k)
        write_slots(self.v[layer], slot_mapping, v)

    def nbytes(self) -> int:
        """Bytes of K and V (page-major: the KV part of the pages, trash block included)."""
        return self.k.numel() * self.k.element_size() * 2
