"""Physical storage of the unified pool: one ``[total_pages, page_elems]`` tensor.

The kernels read adapter rank rows through element offsets into ``flat`` (the same
tensor viewed 1-D, see ``dataplane.kernels.base.LoraModuleWeights.storage``); the KV
block manager addresses whole pages, and the engine's KV cache is a set of strided views
of the same memory (``PagedKVCache.in_pages(backing)``, see ``dataplane.pool.unified``):
KV block ``p`` *is* page ``p``. ``spare_pages`` rows after the last page belong to no
pool page (the KV cache's trash block lives there); ``backing`` covers them, ``data`` and
``flat`` do not. Nothing here copies per step.

Copies: on CUDA the host payload (pinned) goes to the device on a side stream that
first waits for the compute stream, and a recorded event marks completion; on CPU the
copy is synchronous and the event is born complete. A *deferred* copy (fault
injection "delay copy", or tests of in-flight transfers) performs its writes only when
the event is waited on, which is how a CPU run models a DMA still in flight.
"""

from __future__ import annotations

import torch

from dataplane.pool.errors import PageOwnershipError, ValidationFailed
from dataplane.pool.events import CompletedEvent, CopyEvent, PendingEvent
from dataplane.pool.packing import PackedAdapter
from dataplane.pool.page_demand import PageGeometry, RowPlan


class CudaEvent:
    """A recorded ``torch.cuda.Event``; keeps the copy's source tensors alive until done.

    ``staged`` is the device-side copy of the payload, kept for validation until the
    transaction drops the event.
    """

    def __init__(self, event: torch.cuda.Event, keep: tuple[torch.Tensor, ...],
                 staged: torch.Tensor) -> None:
        self._event = event
        self._keep: tuple[torch.Tensor, ...] | None = keep
        self.staged: torch.Tensor | None = staged

    def query(self) -> bool:
        done = bool(self._event.query())
        if done:
            self._keep = None
        return done

    def synchronize(self) -> None:
        self._event.synchronize()
        self._keep = None


def drop_staging(event: CopyEvent) -> None:
    """Release the device staging copy a validated CUDA copy kept for comparison."""
    inner = getattr(event, "inner", event)
    if isinstance(inner, CudaEvent):
        inner.staged = None


class PageStorage:
    """The pool tensor. ``data[p]`` is page ``p``; ``flat`` is the same memory 1-D;
    ``backing [total_pages + spare_pages, page_elems]`` is the whole allocation."""

    def __init__(self, geometry: PageGeometry, total_pages: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", *, spare_pages: int = 0) -> None:
        if torch.tensor([], dtype=dtype).element_size() != geometry.elem_bytes:
            raise ValidationFailed(f"dtype {dtype} is not {geometry.elem_bytes} bytes")
        if isinstance(spare_pages, bool) or not isinstance(spare_pages, int) or spare_pages < 0:
            raise ValidationFailed(f"spare_pages must be an int >= 0, got {spare_pages!r}")
        self.geometry = geometry
        self.device = torch.device(device)
        self.backing = torch.zeros(total_pages + spare_pages, geometry.page_elems, dtype=dtype,
                                   device=self.device)
        self.data = self.backing[:total_pages]
        self.flat = self.data.view(-1)
        self._copy_stream = (torch.cuda.Stream(device=self.device)
                             if self.device.type == "cuda" else None)

    @property
    def async_copies(self) -> bool:
        """True when copies run on a side stream with a recorded event (CUDA)."""
        return self._copy_stream is not None

    @property
    def total_pages(self) -> int:
        return int(self.data.shape[0])

    def _index(self, pages: tuple[int, ...]) -> torch.Tensor:
        if any(not 0 <= p < self.total_pages for p in pages):
            raise PageOwnershipError(f"pages {pages} outside the pool")
        return torch.tensor(pages, dtype=torch.int64, device=self.device)

    def copy_in(self, pages: tuple[int, ...], payload: torch.Tensor,
                deferred: bool = False) -> CopyEvent:
        """Write ``payload [len(pages), page_elems]`` into ``pages``; returns its event."""
        if tuple(payload.shape) != (len(pages), self.geometry.page_elems):
            raise ValidationFailed(f"payload {list(payload.shape)} does not fit "
                                   f"{len(pages)} pages", reason="layout")
        if payload.dtype != self.data.dtype:
            raise ValidationFailed(f"payload dtype {payload.dtype} is not the pool's "
                                   f"{self.data.dtype}", reason="layout")
        idx = self._index(pages)
        if self._copy_stream is not None:
            src = payload if payload.is_pinned() else payload.pin_memory()
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._copy_stream):
                staged = src.to(self.device, non_blocking=True)
                self.data.index_copy_(0, idx, staged)
                event = torch.cuda.Event()
                event.record(self._copy_stream)
            return CudaEvent(event, (src, idx), staged)
        if deferred:
            def land() -> None:
                self.data.index_copy_(0, idx, payload)
            return PendingEvent(land)
        self.data.index_copy_(0, idx, payload)
        return CompletedEvent()

    def read(self, pages: tuple[int, ...]) -> torch.Tensor:
        """The pages' current contents (a device tensor, not a view)."""
        return self.data[self._index(pages)]

    def zero(self, pages: tuple[int, ...]) -> None:
        if pages:
            self.data[self._index(pages)] = 0

    def check_staged(self, pages: tuple[int, ...], packed: PackedAdapter,
                     reference: torch.Tensor | None = None, *,
                     host_verified: bool = False) -> None:
        """Layout + content + zero-padding check of staged pages (after the copy event).

        The host payload's padding (page tails, rank rows beyond the logical rank) is
        checked on the host unless ``host_verified`` (a host-tier image, checked once
        at admission); the staged pages are then compared with ``reference`` (the
        device-side copy source, or the payload) in one device comparison. On a
        mismatch the failure is classified (``padded_tail`` or ``content``).
        """
        if len(pages) != packed.num_pages:
            raise ValidationFailed(f"{len(pages)} pages staged, plan needs {packed.num_pages}",
                                   reason="layout")
        if not host_verified and not padding_is_zero(packed.plan, packed.payload):
            raise ValidationFailed("host payload has non-zero padding", reason="padded_tail")
        staged = self.read(pages)
        ref = reference if reference is not None else packed.payload.to(self.device)
        if torch.equal(staged, ref.to(self.data.dtype)):
            return
        if not padding_is_zero(packed.plan, staged.cpu()):
            raise ValidationFailed("staged pages have non-zero padding", reason="padded_tail")
        raise ValidationFailed("staged bytes differ from the verified payload",
                               reason="content")


def padding_is_zero(plan: RowPlan, pages: torch.Tensor) -> bool:
    """True iff every page tail and every padded rank row of ``pages [P, E]`` is zero (CPU)."""
    e = plan.geometry.page_elems
    used = torch.tensor(plan.used, dtype=torch.int64)
    tail = torch.arange(e, dtype=torch.int64)[None, :] >= used[:, None]
    if bool((pages[tail] != 0).any()):
        return False
    for m in plan.modules:
        s = m.shape
        for i in range(s.rank, s.physical_rank):
            for (p, off), w in ((m.a[i], s.d_in), (m.b[i], s.d_out)):
                if bool((pages[p, off : off + w] != 0).any()):
                    return False
    return True
