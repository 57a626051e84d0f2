"""The LoRA fold over the unified pool: fold slots filled from adapter pages.

On one GPU the agent keeps adapter factors in the unified pool's pages (KV blocks and
factor rank rows in one buffer, dataplane/pool/unified.py), addressed by the kernels'
row tables (dataplane/pool/kernel_tables.py). A LoRA fold (dataplane/layers/
lora_fold_store.py) holds its own copies of the factors of the adapters a decode step
uses, so a fold slot is filled by copying an adapter's rank rows out of its pages:

* `PagedFoldSource` (one per projection) turns the host copies of the published row
  offsets into copy jobs: each live ``A`` and ``Bt`` rank row from its page, rows past the
  slice's rank from a zero row, the scale from the device scale table. `FoldSlots` runs
  all of a step's jobs in one launch on CUDA (dataplane/ops/triton/copy_jobs.py); on CPU
  `copy_to_fold` gathers the same rows with torch ops.
* `FoldInvalidator` is a pool listener: when a slot is published anew or reclaimed, the
  fold slot holding it is emptied (`FoldSlots.forget`), so the next step using the slot
  copies the new adapter in. A page a fold copied from may then go to KV or another
  adapter; the fold keeps its own bytes.

Ordering: the copies are queued on the compute stream when a step's rows are mapped, after
the publication of every slot the step names (a load's page copy completes before it is
published), and before the step's kernels, so they read what the kernels would.
"""

from __future__ import annotations

import numpy as np
import torch

from dataplane.kernels.base import gather_rank_rows
from dataplane.kernels.errors import LoraShapeError
from dataplane.layers.lora_fold_slots import FoldSlots
from dataplane.layers.lora_fold_store import FoldStore
from dataplane.pool.kernel_tables import KernelTables
from dataplane.pool.slot_table import PointerEntry


class PagedFoldSource:
    """Fold slots of one projection (`store`) <- its slots' rank rows in the pool."""

    def __init__(self, tables: KernelTables, layer: int, name: str, store: FoldStore,
                 zeros: torch.Tensor) -> None:
        group = tables.groups[(layer, name)]
        if store.weight_aug.shape[1] != group.in_features:
            raise LoraShapeError(f"{name} of layer {layer}: the fold has another d_in")
        if zeros.numel() < max(group.in_features, *group.out_features) \
                or zeros.dtype != store.weight_aug.dtype:
            raise LoraShapeError("the zero row is too short or of another dtype")
        self.tables, self.store, self.zeros = tables, store, zeros
        self.lo, _hi = tables.slice_range(layer, name)
        self.num_slots = tables.host_rows.shape[1]
        self.max_rank = tables.max_rank
        self.out_features = group.out_features
        self.in_features = group.in_features
        self.dtype = tables.storage.flat.dtype

    def word_aligned(self) -> bool:
        es = self.store.weight_aug.element_size()
        sizes = (self.in_features, *self.out_features, self.tables.storage.geometry.page_elems)
        ptrs = (self.tables.storage.flat.data_ptr(), self.zeros.data_ptr(),
                self.store.weight_aug.data_ptr(), *(b.data_ptr() for b in self.store.b))
        return all(n * es % 4 == 0 for n in sizes) and all(p % 4 == 0 for p in ptrs)

    def _offsets(self, k: int, table_slots: np.ndarray) -> tuple[np.ndarray, ...]:
        """Slice k: (live [n, R] rank rows, A offsets [n, R], Bt offsets [n, R]) in
        elements of the flat pool, R the fold's rank (rows past the table's rank dead)."""
        row, rank = self.lo + k, self.store.rank
        pad = ((0, 0), (0, rank - self.max_rank))
        live = np.arange(rank)[None, :] < self.tables.host_rows[row, table_slots][:, None]
        a = np.pad(self.tables.host_a[row, table_slots], pad)
        b = np.pad(self.tables.host_b[row, table_slots], pad)
        return live, a, b

    def fold_jobs(self, table_slots: np.ndarray, fold_slots: np.ndarray) -> np.ndarray:
        store, es = self.store, self.store.weight_aug.element_size()
        rank, slices, d_in = store.rank, len(self.out_features), self.in_features
        flat, zero = self.tables.storage.flat.data_ptr(), self.zeros.data_ptr()
        tail = store.weight_aug.data_ptr() + store.base_rows * d_in * es
        scales = self.tables.scales
        n_slots = scales.shape[1]
        i = np.arange(rank)[None, :]
        f = fold_slots[:, None]
        jobs = []
        for k, width in enumerate(self.out_features):
            live, a, b = self._offsets(k, table_slots)
            a_dst = tail + ((f * slices + k) * rank + i) * d_in * es
            b_dst = store.b[k].data_ptr() + (f * rank + i) * width * es
            for src, dst, size in ((np.where(live, flat + a * es, zero), a_dst, d_in * es),
                                   (np.where(live, flat + b * es, zero), b_dst, width * es)):
                jobs.append(np.stack([src.ravel(), dst.ravel(),
                                      np.full(src.size, size, dtype=np.int64)], axis=-1))
            s_src = scales.data_ptr() + ((self.lo + k) * n_slots + table_slots) * 4
            s_dst = store.scale.data_ptr() + (fold_slots * slices + k) * 4
            jobs.append(np.stack([s_src, s_dst, np.full(len(s_src), 4, dtype=np.int64)],
                                 axis=-1))
        return np.concatenate(jobs).astype(np.int64)

    def copy_to_fold(self, table_slots: list[int], fold_slots: list[int]) -> None:
        store, dev = self.store, self.store.weight_aug.device
        flat = self.tables.storage.flat
        s = np.asarray(table_slots, dtype=np.int64)
        f = torch.as_tensor(fold_slots, dtype=torch.int64, device=dev)
        tail = store.weight_aug[store.base_rows:].view(store.hot_slots, len(self.out_features),
                                                       store.rank, -1)
        with torch.no_grad():
            for k, width in enumerate(self.out_features):
                live, a, b = (torch.as_tensor(x, device=dev) for x in self._offsets(k, s))
                for dst, off, w in ((tail[:, k], a, self.in_features), (store.b[k], b, width)):
                    rows = gather_rank_rows(flat, off, w)
                    dst[f] = torch.where(live[..., None], rows, torch.zeros((), dtype=rows.dtype,
                                                                            device=dev))
                store.scale[f, k] = self.tables.scales[self.lo + k,
                                                       torch.as_tensor(s, device=dev)]


class FoldInvalidator:
    """A pool `SlotListener`: a slot published anew or reclaimed leaves the fold."""

    def __init__(self, slots: FoldSlots) -> None:
        self.slots = slots

    def on_publish(self, entry: PointerEntry) -> None:
        self.slots.forget(entry.handle.slot_id)

    def on_unpublish(self, slot: int) -> None:
        self.slots.forget(slot)


def attach_paged_folds(slots: FoldSlots, tables: KernelTables,
                       stores: dict[tuple[int, str], FoldStore]) -> FoldInvalidator:
    """Fill every projection's fold `stores[(layer, name)]` from `tables`' pages; returns
    the listener the pool must tell of publications and reclaims."""
    if set(stores) != set(tables.groups):
        raise LoraShapeError("a fold store for every kernel call site of the pool")
    first = next(iter(stores.values()))
    widest = max(max(g.in_features, *g.out_features) for g in tables.groups.values())
    zeros = torch.zeros(widest, dtype=first.weight_aug.dtype, device=first.weight_aug.device)
    for (layer, name), store in stores.items():
        slots.attach_source(PagedFoldSource(tables, layer, name, store, zeros))
    return FoldInvalidator(slots)
