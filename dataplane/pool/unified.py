"""The unified pool that serves both KV blocks and adapter factor pages: sizing and the KV view.

Physical story (docs/ARCHITECTURE.md, "The unified pool"; S-LoRA unified paging):

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
* **One buffer.** The pool's :class:`~dataplane.pool.page_storage.PageStorage` is the
  only allocation: ``[N + 1, page_elems]`` in the model dtype. Adapter factor rows are
  packed into pages of class adapter (transactions copy whole pages); the engine's
  ``PagedKVCache`` is built by :func:`kv_cache_on` as strided views of the same memory,
  page-major: page ``p`` holds ``[layers][2 (K, V)][block_size][kv_heads][head_dim]`` in
  its first ``kv_block_elems`` elements, so layer ``l``'s K cache is a view
  ``[N + 1, block_size, kv_heads, head_dim]`` with ``stride(0) == page_elems``. Writing a
  request's KV therefore changes exactly the bytes of its KV pages and nothing else; an
  adapter copy writes only pages the ledger gave to that load (never a KV page). Row
  ``N`` is a spare row outside the page-id space: the KV cache's trash block (graph
  padding rows write there). Device bytes: ``(N + 1) * page_bytes``.

Ordering on CUDA: an adapter copy runs on a side stream that first waits for the compute
stream (so KV reads/writes of a page's previous owner, enqueued before, finish first);
a page leaves an adapter only after its last-use and copy events completed (eviction
eligibility), and KV writes to it are enqueued after that on the compute stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dataplane.attention.kv_cache import PagedKVCache
from dataplane.models.config import ModelConfig
from dataplane.pool.errors import LayoutError
from dataplane.pool.page_demand import FactorShape, PageGeometry, adapter_page_demand
from dataplane.pool.page_storage import PageStorage

KV_SPARE_PAGES = 1
"""Storage rows after the ``N`` pool pages: the KV cache's trash block."""


@dataclass(frozen=True)
class KvDims:
    """Shape of one KV block: K and V of ``block_size`` tokens in every layer."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int

    @property
    def block_elems(self) -> int:
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class UnifiedLayout:
    """Page geometry and size of one unified pool (see module docstring)."""

    geometry: PageGeometry
    total_pages: int
    kv: KvDims

    @property
    def kv_block_elems(self) -> int:
        return self.kv.block_elems

    @property
    def kv_block_bytes(self) -> int:
        return self.kv_block_elems * self.geometry.elem_bytes

    def device_bytes(self) -> dict[str, int]:
        """Bytes of the one device buffer: ``pages`` (the pool) and ``spare`` (trash block)."""
        return {"pages": self.total_pages * self.geometry.page_bytes,
                "spare": KV_SPARE_PAGES * self.geometry.page_bytes}


def kv_block_elems(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int) -> int:
    """Elements of one KV block: K and V of ``block_size`` tokens in every layer."""
    dims = (num_layers, block_size, num_kv_heads, head_dim)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise LayoutError(f"bad KV dims {dims}")
    return KvDims(*dims).block_elems


PAGE_ELEM_ALIGN = 16
"""Page size is rounded up to this many elements (see `unified_layout`)."""


def unified_layout(total_pages: int, *, num_layers: int, block_size: int, num_kv_heads: int,
                   head_dim: int, widest_row: int, elem_bytes: int) -> UnifiedLayout:
    """A pool of ``total_pages`` pages sized so a page holds one KV block or factor rows."""
    if isinstance(total_pages, bool) or not isinstance(total_pages, int) or total_pages < 1:
        raise LayoutError(f"total_pages must be an int >= 1, got {total_pages!r}")
    if widest_row < 1:
        raise LayoutError(f"widest factor row must be >= 1, got {widest_row}")
    kv = kv_block_elems(num_layers, block_size, num_kv_heads, head_dim)
    # A multiple of 16 elements: the page stride is the KV cache's block stride, and the
    # Triton kernels only vectorise (cp.async, 16-byte loads) when it is 16-divisible.
    page_elems = -(-max(kv, widest_row) // PAGE_ELEM_ALIGN) * PAGE_ELEM_ALIGN
    return UnifiedLayout(PageGeometry(page_elems, elem_bytes), total_pages,
                         KvDims(num_layers, block_size, num_kv_heads, head_dim))


def adapter_room_pages(config: ModelConfig, *, block_size: int, elem_bytes: int, rank: int,
                       slots: int) -> int:
    """Pages `slots` adapters of `rank` on every adaptable projection of every layer take
    in a pool of this model's pages: the most the adapters a pool of `slots` slots holds
    can take from its KV blocks."""
    widest = max(max(shape) for shape in config.module_shapes.values())
    geometry = unified_layout(1, num_layers=config.num_layers, block_size=block_size,
                              num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                              widest_row=widest, elem_bytes=elem_bytes).geometry
    shapes = [FactorShape(layer, name, rank, d_in, d_out, rank, Fraction(1))
              for layer in range(config.num_layers)
              for name, (d_out, d_in) in config.module_shapes.items()]
    return slots * adapter_page_demand(shapes, geometry)


def kv_cache_on(storage: PageStorage, layout: UnifiedLayout) -> PagedKVCache:
    """The engine's KV cache as page-major views of ``storage`` (allocates nothing).

    ``storage`` must have ``layout``'s geometry, ``layout.total_pages`` pages and at least
    :data:`KV_SPARE_PAGES` spare rows; the cache's block ``p`` is page ``p``, its trash block
    the first spare row. Its dtype is the storage's (the model dtype)."""
    if storage.geometry != layout.geometry or storage.total_pages != layout.total_pages \
            or storage.backing.shape[0] < layout.total_pages + KV_SPARE_PAGES:
        raise LayoutError(f"storage of {storage.total_pages} pages "
                          f"(+{storage.backing.shape[0] - storage.total_pages} spare) does "
                          f"not fit the layout of {layout.total_pages} pages + "
                          f"{KV_SPARE_PAGES} spare")
    k = layout.kv
    pages = storage.backing[:layout.total_pages + KV_SPARE_PAGES]
    return PagedKVCache.in_pages(pages, k.num_layers, k.block_size, k.num_kv_heads,
                                 k.head_dim)
