"""Adapter slots in the agent's unified page pool (KV blocks and adapter factors).

One :class:`~dataplane.pool.device_pool.DevicePool` per engine, sized by
:func:`~dataplane.pool.unified.unified_layout`: ``num_kv_blocks`` pages, engine KV block
``i`` == pool page ``i`` (see that module for the physical story). One device buffer: the
pool's page storage holds the adapter factors *and* the engine's KV cache
(:attr:`PoolSlots.kv_cache`, page-major views of the same pages, passed to the engine as
``kv_cache``). The engine draws KV
blocks through a reclaiming :class:`~dataplane.pool.kv_view.KvPageView`, so KV growth
may evict idle adapters, and an adapter load is one
:func:`~dataplane.pool.transactions.admit` transaction whose admission counts the
waiting requests' KV: ``free + reclaimable >= adapter incremental + KV initial +
growth reserve + guard``.

Ownership: a request holds one pool reference on its adapter's residency from the
moment it enters the engine until it ends (:meth:`PoolSlots.hold` / :meth:`unhold`),
so only adapters no request holds can be victims. When the pool evicts one (for KV
growth or for another load) this backend drops the engine binding at once and tells
the agent through ``eviction_listener``.

Host tier: an adapter's packed image is verified (bytes digest, zero padding) once,
when it enters the host tier; device loads from it only copy and compare on device.

The engine is built with `external_factors=True` (it allocates no factor tables: its
projections read the pool's). `enable_fold` folds decode steps' LoRA into the base GEMMs
from the pages (dataplane/pool/fold_source.py). With `member_slots`, natively served
collection members take the slots above the pool's (no pages; agent/native_members.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agent.native_members import NativeSlots
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.kernels.base import LoraModuleWeights
from dataplane.layers.lora_fold_slots import FoldSlots
from dataplane.layers.lora_fold_store import FoldStore
from dataplane.models.llama import LORA_GROUPS, LlamaForCausalLM
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.events import CompletedEvent, CopyEvent
from dataplane.pool.faults import FaultInjector
from dataplane.pool.fold_source import attach_paged_folds
from dataplane.pool.host_tier import HostTier
from dataplane.pool.kernel_tables import KernelTables, ModuleGroup
from dataplane.pool.kv_view import KvPageView
from dataplane.pool.packing import factors_from_modules, pack_adapter
from dataplane.pool.residency import Residency
from dataplane.pool.slot_table import LaunchSnapshot, PointerEntry, SlotHandle
from dataplane.pool.transactions import LoadRequest, admit
from dataplane.pool.unified import KV_SPARE_PAGES, UnifiedLayout, kv_cache_on, unified_layout

if TYPE_CHECKING:
    from dataplane.engine.engine import Engine


@dataclass(frozen=True)
class _PoolFactors:
    """What a LoRA linear reads (`.weights`), backed by the pool's address tables."""

    weights: LoraModuleWeights


class PoolSlots:
    """Adapter slots + KV blocks in one :class:`DevicePool` (see module docstring).

    Build with :meth:`for_model` *before* the engine (its ``kv_view`` is the engine's
    ``kv_pages``, its ``kv_cache`` the engine's ``kv_cache``), then :meth:`attach` the
    engine.
    """

    def __init__(self, model: LlamaForCausalLM, layout: UnifiedLayout, max_slots: int,
                 max_rank: int, host_bytes: int = 1 << 30, *, kv_growth: int = 1,
                 guard: int = 0, faults: FaultInjector | None = None,
                 member_slots: int = 0) -> None:
        self.model, self.layout = model, layout
        self.dtype = model.dtype
        self.max_rank = max_rank
        self.kv_growth, self.guard = kv_growth, guard
        self.host = HostTier(host_bytes)
        self.pool = DevicePool(layout.geometry, layout.total_pages, max_slots, self.dtype,
                               model.embed_tokens.weight.device, host_tier=self.host,
                               faults=faults, rehash_on_load=False, full_audit=False,
                               spare_pages=KV_SPARE_PAGES)
        self.kv_cache = kv_cache_on(self.pool.storage, layout)
        """The engine's KV cache: views of the pool's pages (KV block i is page i)."""
        self.kv_view = KvPageView(self.pool, reclaim=True)
        self.kv_view.on_evict.append(self._notify_evicted)
        cfg = model.config
        shapes = cfg.module_shapes
        groups = [ModuleGroup(layer, attr, names, shapes[names[0]][1],
                              tuple(shapes[n][0] for n in names))
                  for layer in range(cfg.num_layers) for attr, names in LORA_GROUPS.items()]
        self.max_slots, self.member_slots = max_slots, member_slots
        """The pool's slots are [0, max_slots); natively served collection members take
        [max_slots, max_slots + member_slots) (the engine's collection tables, no pages)."""
        self.native = NativeSlots()
        self.tables = KernelTables(self.pool.storage, groups, max_slots + member_slots,
                                   max_rank)
        self.pool.listeners.extend([self.tables, self])
        self._engine: Engine | None = None
        self._handles: dict[int, tuple[SlotHandle, str, int, AdapterHandle]] = {}
        self._modules: dict[int, frozenset[tuple[int, str]]] = {}
        self._evicted: list[str] = []
        self.eviction_listener: Callable[[str], None] | None = None

    @classmethod
    def for_model(cls, model: LlamaForCausalLM, *, num_pages: int, block_size: int,
                  max_slots: int, max_rank: int, **kwargs: object) -> PoolSlots:
        cfg = model.config
        layout = unified_layout(
            num_pages, num_layers=cfg.num_layers, block_size=block_size,
            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            widest_row=max(max(s) for s in cfg.module_shapes.values()),
            elem_bytes=torch.tensor([], dtype=model.dtype).element_size())
        return cls(model, layout, max_slots, max_rank, **kwargs)  # type: ignore[arg-type]

    def attach(self, engine: Engine) -> None:
        """Point every LoRA linear of `engine` at the pool's address tables."""
        if engine.block_manager.pool is not self.kv_view:
            raise ValueError("the engine must draw its KV blocks from this pool's kv_view")
        if engine.runner.cache is not self.kv_cache:
            raise ValueError("the engine's KV cache must be this pool's kv_cache")
        if engine.config.max_slots > 0 and not engine.config.external_factors:
            raise ValueError("build the engine with external_factors=True: its projections "
                             "read the pool's tables, not factor tables of its own")
        if engine.config.max_slots not in (0, self.max_slots + self.member_slots):
            raise ValueError(f"the engine needs {self.max_slots} pool slots + "
                             f"{self.member_slots} member slots (or none: no LoRA)")
        if self.member_slots:
            if not engine.runner.collections:
                raise ValueError("member slots need an engine with collection blocks")
            engine.collections.slots = range(self.max_slots,
                                             self.max_slots + self.member_slots)
        self._engine = engine
        for layer, attr, linear in self.model.lora_linears():
            linear.attach_factors(_PoolFactors(self.tables.weights(layer, attr)))

    def enable_fold(self) -> None:
        """Fold decode steps' LoRA into the base GEMMs (dataplane/pool/fold_source.py):
        fold slots filled from the pool's pages, emptied when their slot is published anew
        or reclaimed. After `attach`, before any load and before graphs are captured."""
        if self._handles:
            raise ValueError("enable the LoRA fold before loading adapters")
        engine = self.engine

        def paged(slots: FoldSlots, stores: dict[tuple[int, str], FoldStore]) -> None:
            self.pool.listeners.append(attach_paged_folds(slots, self.tables, stores))

        engine.runner.enable_lora_fold(engine.config.max_num_seqs, paged=paged)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("PoolSlots.attach(engine) was not called")
        return self._engine

    # ---- loads -----------------------------------------------------------------------
    def load(self, key: str, adapter: LoadedAdapter, kv_pages: int = 0) -> AdapterHandle:
        """Host image (verified once), then one admission transaction that also proves
        room for `kv_pages` of the waiting requests' initial KV plus the growth reserve
        and guard. Raises a PoolError with nothing changed when it does not fit. A
        `NativeMember` (agent/native_members.py) is served from the engine's collection
        tables in a member slot instead (no pages)."""
        member = self.native.load(self.engine, adapter)
        if member is not None:
            return member
        packed = self.host.peek(key)
        if packed is None:
            packed = pack_adapter(key, factors_from_modules(adapter.modules),
                                  self.layout.geometry, self.dtype)
            self.host.put(packed)
        self._make_room(key, (0 if self.pool.visible(key) else packed.num_pages)
                        + kv_pages + self.kv_growth + self.guard)
        try:
            admission = admit(self.pool, LoadRequest(key, kv_initial=kv_pages,
                                                     kv_growth=self.kv_growth,
                                                     guard=self.guard))
        finally:
            self._notify_evicted()
        slot = admission.handle.slot_id
        handle = AdapterHandle(slot, adapter.digest, admission.handle.slot_generation,
                               adapter.max_rank, adapter.source)
        self.engine.adapters.bind_external(handle, adapter)
        self._handles[slot] = (admission.handle, key, admission.generation, handle)
        self._modules[slot] = frozenset((m.layer, m.module) for m in adapter.modules)
        self._mark_linears()
        return handle

    def _make_room(self, key: str, demand: int) -> None:
        """Unreferenced prefix-cache KV blocks are reclaimable too: return just enough of
        them to the pool that free + reclaimable adapter pages cover ``demand``."""
        short = demand - self.pool.pages.num_free - self.pool.reclaimable_pages(key)
        if short > 0:
            self.engine.block_manager.evict(short)

    def unload(self, handle: AdapterHandle) -> None:
        """Retire the residency; it is reclaimed once no launch or reference holds it."""
        if self.native.unload(self.engine, handle):
            return
        entry = self._handles.pop(handle.slot, None)
        if entry is None or entry[3] != handle:
            return
        self._modules.pop(handle.slot, None)
        self._mark_linears()
        self.engine.adapters.release_external(handle)
        res = self.pool.residents.get((entry[1], entry[2]))
        if res is not None:
            self.pool.retire(res)

    def hold(self, handle: AdapterHandle) -> None:
        """A request bound to `handle` entered the engine: never a victim until unhold."""
        if not self.native.holds(handle):
            self.pool.acquire(self._residency(handle))

    def unhold(self, handle: AdapterHandle) -> None:
        entry = self._handles.get(handle.slot)
        if entry is None or entry[3] != handle:
            return  # unloaded already, or a native member (no residency)
        self.pool.release_ref(self._residency(handle))

    def pool_handle(self, handle: AdapterHandle) -> SlotHandle:
        """The pool's generation-stamped handle behind an engine handle (KeyError: not
        bound here)."""
        entry = self._handles[handle.slot]
        if entry[3] != handle:
            raise KeyError(handle.slot)
        return entry[0]

    def _residency(self, handle: AdapterHandle) -> Residency:
        _, key, generation, _ = self._handles[handle.slot]
        return self.pool.residents[(key, generation)]

    # ---- pool listener: evictions ------------------------------------------------------
    def on_publish(self, entry: PointerEntry) -> None:
        return None

    def on_unpublish(self, slot: int) -> None:
        """The pool unpublished a slot this backend still binds: it evicted an idle
        adapter (KV growth or another load's victim). Drop the binding now."""
        entry = self._handles.pop(slot, None)
        if entry is None:
            return
        self._modules.pop(slot, None)
        self._mark_linears()
        if self._engine is not None:
            self._engine.adapters.release_external(entry[3])
        self._evicted.append(entry[1])

    def _notify_evicted(self) -> None:
        evicted, self._evicted = self._evicted, []
        if self.eviction_listener is not None:
            for key in evicted:
                self.eviction_listener(key)

    def set_eviction_listener(self, listener: Callable[[str], None]) -> None:
        self.eviction_listener = listener

    def _mark_linears(self) -> None:
        adapted = set().union(*self._modules.values()) if self._modules else set()
        for layer, attr, linear in self.model.lora_linears():
            linear.set_adapted(any((layer, m) in adapted for m in LORA_GROUPS[attr]))

    # ---- launches ----------------------------------------------------------------------
    def begin_launch(self, row_slots: tuple[int, ...]) -> LaunchSnapshot | None:
        used = {s for s in row_slots if 0 <= s < self.max_slots}  # not base rows, not members
        if not used:
            return None
        return self.pool.begin_launch(self._handles[s][0] for s in sorted(used))

    def end_launch(self, snap: LaunchSnapshot | None) -> None:
        if snap is None:
            return
        event: CopyEvent = CompletedEvent()
        if self.pool.storage.device.type == "cuda":
            cuda_event = torch.cuda.Event()
            cuda_event.record()
            event = cuda_event
        self.pool.end_launch(snap, event)
        self.pool.reclaim_retired()

    def collection_of(self, slot: int) -> str | None:
        return self.native.collection_of(slot)

    def gauges(self) -> dict[str, dict[str, int]]:
        return {**self.pool.gauges(), "reclaimable": {"pages": self.pool.reclaimable_pages()},
                "device_bytes": self.layout.device_bytes()}
