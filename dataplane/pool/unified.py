"""Sizing of the unified pool that serves both KV blocks and adapter factor pages.

Physical story (the simplest honest design; DESIGN §5, S-LoRA unified paging):

* **One page-id space.** The pool has ``N`` pages, ids ``[0, N)``. The engine is built
  with ``num_kv_blocks == N`` and draws KV blocks through
  :class:`~dataplane.pool.kv_view.KvPageView`, so *engine KV block ``i`` is pool page
  ``i``*: the block table of every request indexes pool pages of class KV, and an
  adapter page id is never a KV block id at the same time (the page ledger refuses it).
  Admission and conservation are therefore joint: ``free + reserved + adapter + KV = N``
  after every transaction, and a cold adapter load competes with KV growth for the same
  ``N`` pages (``free + reclaimable >= adapter incremental + KV initial + growth + guard``).
* **One page size.** A page is ``page_elems`` elements of the model dtype, with
  ``page_elems = max(kv_block_elems, widest factor row)`` and
  ``kv_block_elems = 2 * layers * block_size * kv_heads * head_dim`` (K and V of
  ``block_size`` tokens, every layer). So one KV block is exactly one page of bytes
  whenever a KV block is at least one factor row wide (true for every real model: an 8B
  Llama block of 16 tokens is 1 Mi elements, its widest row 14336), and one page holds
  ``floor(page_elems / width)`` rank rows of an adapter.
* **Two backing planes (what is not unified yet).** The KV bytes of page ``i`` live in the
  runner's layer-major ``PagedKVCache`` (owned by ``dataplane.attention``); the adapter
  bytes of page ``i`` live in :class:`~dataplane.pool.page_storage.PageStorage`. Both are
  allocated for all ``N`` ids, so the device holds ``N * (kv_block_bytes + page_bytes)``
  bytes while the admission arithmetic counts ``N`` pages. Folding the planes into one
  buffer needs ``PagedKVCache`` to accept an external page-major buffer (its layout is
  layer-major, so a KV block is not one contiguous run today): that is a change in
  ``dataplane.attention``, not here. :func:`device_bytes` reports both planes.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.pool.errors import LayoutError
from dataplane.pool.page_demand import PageGeometry


@dataclass(frozen=True)
class UnifiedLayout:
    """Page geometry and size of one unified pool (see module docstring)."""

    geometry: PageGeometry
    total_pages: int
    kv_block_elems: int

    @property
    def kv_block_bytes(self) -> int:
        return self.kv_block_elems * self.geometry.elem_bytes

    def device_bytes(self) -> dict[str, int]:
        """Bytes of each backing plane (both are allocated for every page id)."""
        return {"kv_plane": self.total_pages * self.kv_block_bytes,
                "adapter_plane": self.total_pages * self.geometry.page_bytes}


def kv_block_elems(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int) -> int:
    """Elements of one KV block: K and V of ``block_size`` tokens in every layer."""
    dims = (num_layers, block_size, num_kv_heads, head_dim)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise LayoutError(f"bad KV dims {dims}")
    return 2 * num_layers * block_size * num_kv_heads * head_dim


def unified_layout(total_pages: int, *, num_layers: int, block_size: int, num_kv_heads: int,
                   head_dim: int, widest_row: int, elem_bytes: int) -> UnifiedLayout:
    """A pool of ``total_pages`` pages sized so a page holds one KV block or factor rows."""
    if isinstance(total_pages, bool) or not isinstance(total_pages, int) or total_pages < 1:
        raise LayoutError(f"total_pages must be an int >= 1, got {total_pages!r}")
    if widest_row < 1:
        raise LayoutError(f"widest factor row must be >= 1, got {widest_row}")
    kv = kv_block_elems(num_layers, block_size, num_kv_heads, head_dim)
    return UnifiedLayout(PageGeometry(max(kv, widest_row), elem_bytes), total_pages, kv)
