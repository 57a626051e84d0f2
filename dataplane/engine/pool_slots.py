"""The engine's adapter slots and KV blocks in one unified page pool.

Every `Engine` holds exactly one :class:`PoolSlots` (docs/ARCHITECTURE.md, "The unified
pool"). It owns one :class:`~dataplane.pool.device_pool.DevicePool` sized by
:func:`~dataplane.pool.unified.unified_layout`: ``num_kv_blocks`` pages, engine KV block
``i`` == pool page ``i``. One device buffer holds the adapter factors *and* the engine's
KV cache (:attr:`PoolSlots.kv_cache`, page-major views of the same pages). The engine
draws KV blocks through a reclaiming :class:`~dataplane.pool.kv_view.KvPageView`, so KV
growth may evict idle adapters, and an adapter load is one
:func:`~dataplane.pool.transactions.admit` transaction whose admission counts the
waiting requests' KV: ``free + reclaimable >= adapter incremental + KV initial +
growth reserve + guard``.

Ownership: a request holds one pool reference on its adapter's residency from the moment
it enters the engine until it ends (the engine calls :meth:`hold` / :meth:`unhold`), so
only adapters no request holds can be victims. When the pool evicts one (for KV growth or
for another load) the engine binding is dropped at once and ``eviction_listener`` hears
the adapter's key.

Launch fence: the engine's step loop opens :meth:`begin_launch` for every plan it
launches (refusing slot generations that are no longer published) and closes it with
:meth:`end_launch` when the plan retires, recording the event that marks the plan's last
use of its slots; a retired slot is reclaimed only after that event.

Host tier: an adapter's packed image is verified (bytes digest, zero padding) once, when
it enters the host tier; device loads from it only copy and compare on device.

The projections read the pool's address tables (:class:`KernelTables`); `enable_fold`
folds decode steps' LoRA into the base GEMMs from the pages (dataplane/pool/
fold_source.py). With `member_slots`, natively served collection members take the slots
above the pool's (they hold no pages; dataplane/engine/native_members.py).

Tensor parallelism: every rank's pool has the same layout (its local shapes) and the
leader's pool decides for all of them. The leader's scheduler allocates KV pages and its
pool places adapters; the followers' pools are storage driven by the leader
(dataplane/engine/lockstep.py): a follower writes its shard of an adapter into the pages
the leader chose (:meth:`mirror_publish`) and drops a slot when the leader's pool
unpublished it (:meth:`mirror_unpublish`; the leader records those in `unpublished`), in
the order the leader did, before the next plan. Every rank's address tables and LoRA fold
then see the same publications in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dataplane.engine.adapters import AdapterError, AdapterHandle, LoadedAdapter
from dataplane.engine.config import DEFAULT_HOST_TIER_BYTES
from dataplane.engine.native_members import NativeSlots
from dataplane.kernels.base import LoraModuleWeights
from dataplane.layers.lora_fold_slots import FoldSlots
from dataplane.layers.lora_fold_store import FoldStore
from dataplane.models.llama import LORA_GROUPS, LlamaForCausalLM
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.events import CompletedEvent, CopyEvent
from dataplane.pool.faults import FaultInjector, FaultPoint
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


@dataclass(frozen=True)
class _Bound:
    """One adapter bound to a pool slot: the pool's handle, the key and generation of its
    residency, and the engine's handle."""

    pool_handle: SlotHandle
    key: str
    generation: int
    handle: AdapterHandle
    pinned: bool


class PoolSlots:
    """Adapter slots + KV blocks in one :class:`DevicePool` (see module docstring).

    Built with :meth:`for_model` before the engine's runner (its ``kv_cache`` is the
    runner's KV cache, its ``kv_view`` the block manager's pages), then attached to the
    engine (:meth:`attach`).
    """

    def __init__(self, model: LlamaForCausalLM, layout: UnifiedLayout, max_slots: int,
                 max_rank: int, host_bytes: int = DEFAULT_HOST_TIER_BYTES, *, kv_growth: int = 1,
                 guard: int = 0, faults: FaultInjector | None = None,
                 member_slots: int = 0) -> None:
        self.model, self.layout = model, layout
        self.dtype = model.dtype
        self.max_rank = max_rank
        self.kv_growth, self.guard = kv_growth, guard
        self.host = HostTier(host_bytes)
        self.images_packed = 0
        """Loads that packed the adapter's image (the others found it in the host tier)."""
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
                                   max(max_rank, 1))
        self.pool.listeners.extend([self.tables, self])
        self._engine: Engine | None = None
        self._bound: dict[int, _Bound] = {}
        self._by_key: dict[str, AdapterHandle] = {}
        self._modules: dict[int, frozenset[tuple[int, str]]] = {}
        self._evicted: list[str] = []
        self.eviction_listener: Callable[[str], None] | None = None
        self.unpublished: list[int] | None = None
        """A TP leader's slots unpublished since the followers last heard (module
        docstring); None: not recorded (one device, or a follower)."""

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
        """Point every LoRA linear of `engine` at the pool's address tables (the engine's
        constructor does this, after building its runner on :attr:`kv_cache`)."""
        if engine.runner.cache is not self.kv_cache:
            raise ValueError("the engine's KV cache must be this pool's kv_cache")
        if self.member_slots:
            engine.collections.slots = range(self.max_slots,
                                             self.max_slots + self.member_slots)
        self._engine = engine
        if self.max_slots == 0 or self.max_rank == 0:
            return
        for layer, attr, linear in self.model.lora_linears():
            linear.attach_factors(_PoolFactors(self.tables.weights(layer, attr)))

    def enable_fold(self, width_unit: int | None = None) -> None:
        """Fold decode steps' LoRA into the base GEMMs (dataplane/pool/fold_source.py):
        fold slots filled from the pool's pages, emptied when their slot is published anew
        or reclaimed. After `attach`, before any load and before graphs are captured (the
        engine's constructor does this for `EngineConfig.lora_fold`). `width_unit`: the
        fold widths' step (`FoldSlots`; None: its default)."""
        if self._bound:
            raise AdapterError("enable the LoRA fold before loading adapters")
        engine = self.engine

        def paged(slots: FoldSlots, stores: dict[tuple[int, str], FoldStore]) -> None:
            self.pool.listeners.append(attach_paged_folds(slots, self.tables, stores))

        engine.runner.enable_lora_fold(engine.config.max_num_seqs, width_unit, paged=paged)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("PoolSlots.attach(engine) was not called")
        return self._engine

    # ---- loads -----------------------------------------------------------------------
    def handle_of(self, key: str) -> AdapterHandle | None:
        """The live handle of the adapter loaded under `key`, if any."""
        return self._by_key.get(key)

    def load(self, key: str, adapter: LoadedAdapter, kv_pages: int = 0, *,
             evictable: bool = False, kv_growth: int | None = None,
             attempt_id: str | None = None) -> AdapterHandle:
        """Host image (verified once), then one admission transaction that also proves
        room for `kv_pages` of the waiting requests' initial KV plus the growth reserve
        and guard. Raises a PoolError with nothing changed when it does not fit. A
        `NativeMember` (dataplane/engine/native_members.py) is served from the engine's
        collection tables in a member slot instead (no pages). The same key loaded twice
        returns the live handle. Not `evictable`: pinned, never a victim of KV growth or
        of another load, until unloaded. `kv_growth` (default: the pool's growth
        reserve) is the KV growth the admission must leave room for: a prefetch passes
        the running requests' committed growth. `attempt_id` names the load transaction
        (a caller's load attempt; refused if already used)."""
        growth = self.kv_growth if kv_growth is None else max(kv_growth, self.kv_growth)
        held = self._by_key.get(key)
        if held is not None:
            return held
        member = self.native.load(self.engine, adapter)
        if member is not None:
            self._by_key[key] = member
            return member
        if self.max_slots == 0 or self.max_rank == 0:
            raise AdapterError("this engine has LoRA disabled (no slots or max_rank=0)")
        self.engine.adapters.check_fits(adapter)
        packed = self.host.peek(key)  # the copy stage touches it (least recent go first)
        if packed is None:
            packed = pack_adapter(key, factors_from_modules(adapter.modules),
                                  self.layout.geometry, self.dtype)
            self.host.put(packed)
            self.images_packed += 1
        self._make_room(key, (0 if self.pool.visible(key) else packed.num_pages)
                        + kv_pages + growth + self.guard)
        try:
            admission = admit(self.pool, LoadRequest(key, kv_initial=kv_pages,
                                                     kv_growth=growth, guard=self.guard,
                                                     attempt_id=attempt_id))
        finally:
            self._notify_evicted()
        slot = admission.handle.slot_id
        handle = AdapterHandle(slot, adapter.digest, admission.handle.slot_generation,
                               adapter.max_rank, adapter.source, adapter.invocation_tokens)
        self.engine.adapters.bind(handle, adapter)
        self._bound[slot] = _Bound(admission.handle, key, admission.generation, handle,
                                   pinned=not evictable)
        if not evictable:
            self.pool.pin(self._residency(handle))
        self._by_key[key] = handle
        self._modules[slot] = frozenset((m.layer, m.module) for m in adapter.modules)
        self._mark_linears()
        return handle

    def _make_room(self, key: str, demand: int) -> None:
        """Unreferenced prefix-cache KV blocks go before idle adapters: return up to what
        free pages lack for ``demand`` to the pool, so the admission evicts an adapter
        only for the rest."""
        short = demand - self.pool.pages.num_free
        if short > 0:
            self.engine.block_manager.evict(short)

    def unload(self, handle: AdapterHandle) -> None:
        """Retire the residency; it is reclaimed once no launch or reference holds it."""
        if self.native.unload(self.engine, handle):
            self._forget_key(handle)
            return
        bound = self._bound.get(handle.slot)
        if bound is None or bound.handle != handle:
            raise AdapterError("adapter handle is not loaded (stale or foreign)",
                               slot=handle.slot)
        res = self.pool.residents.get((bound.key, bound.generation))
        del self._bound[handle.slot]
        self._forget_key(handle)
        self._modules.pop(handle.slot, None)
        self._mark_linears()
        self.engine.adapters.release(handle)
        if res is not None:
            if bound.pinned:
                self.pool.unpin(res)
            self.pool.retire(res)

    def _forget_key(self, handle: AdapterHandle) -> None:
        for key, held in list(self._by_key.items()):
            if held == handle:
                del self._by_key[key]

    def hold(self, handle: AdapterHandle) -> None:
        """A request bound to `handle` entered the engine: never a victim until unhold.
        Handles whose factors hold no pages (native members, tensor-parallel shards) have
        nothing to hold."""
        bound = self._bound.get(handle.slot)
        if bound is not None and bound.handle == handle:
            self.pool.acquire(self._residency(handle))

    def unhold(self, handle: AdapterHandle) -> None:
        bound = self._bound.get(handle.slot)
        if bound is None or bound.handle != handle:
            return  # unloaded already, or no pages (see `hold`)
        self.pool.release_ref(self._residency(handle))

    def pool_handle(self, handle: AdapterHandle) -> SlotHandle:
        """The pool's generation-stamped handle behind an engine handle (KeyError: not
        bound here)."""
        bound = self._bound[handle.slot]
        if bound.handle != handle:
            raise KeyError(handle.slot)
        return bound.pool_handle

    def _residency(self, handle: AdapterHandle) -> Residency:
        bound = self._bound[handle.slot]
        return self.pool.residents[(bound.key, bound.generation)]

    # ---- pool listener: evictions ------------------------------------------------------
    def on_publish(self, entry: PointerEntry) -> None:
        return None

    def on_unpublish(self, slot: int) -> None:
        """The pool unpublished a slot (reclaimed after its retirement, or evicted). For a
        slot this backend still binds it evicted an idle adapter (KV growth or another
        load's victim): drop the binding now."""
        if self.unpublished is not None:
            self.unpublished.append(slot)
        bound = self._bound.pop(slot, None)
        if bound is None:
            return
        self._forget_key(bound.handle)
        self._modules.pop(slot, None)
        self._mark_linears()
        if self._engine is not None:
            self._engine.adapters.release(bound.handle)
        self._evicted.append(bound.key)

    def _notify_evicted(self) -> None:
        evicted, self._evicted = self._evicted, []
        if self.eviction_listener is not None:
            for key in evicted:
                self.eviction_listener(key)

    def _mark_linears(self) -> None:
        adapted = set().union(*self._modules.values()) if self._modules else set()
        for layer, attr, linear in self.model.lora_linears():
            linear.set_adapted(any((layer, m) in adapted for m in LORA_GROUPS[attr]))

    # ---- launches ----------------------------------------------------------------------
    def begin_launch(self, row_slots: tuple[int, ...]) -> LaunchSnapshot | None:
        """Fence a launch over `row_slots` (StaleGeneration when a slot it names is no
        longer published at the bound generation); None when it reads no pool slot."""
        used = {s for s in row_slots if 0 <= s < self.max_slots}  # not base rows, not members
        if not used:
            return None
        return self.pool.begin_launch(self._bound[s].pool_handle for s in sorted(used))

    def end_launch(self, snap: LaunchSnapshot | None) -> None:
        """Close a fence: the launch's last use of its slots is the event recorded now;
        retired residencies whose launches all ended are reclaimed."""
        if snap is None:
            return
        event: CopyEvent = CompletedEvent()
        if self.pool.storage.device.type == "cuda":
            cuda_event = torch.cuda.Event()
            cuda_event.record()
            event = cuda_event
        self.pool.end_launch(snap, event)
        self.pool.reclaim_retired()

    # ---- tensor parallelism ----------------------------------------------------------
    def packed_pages(self, key: str) -> int | None:
        """Pages the adapter loaded (or offered) under `key` takes in the pool: its packed
        host image's; None before its first load (and for collection members, which take
        none)."""
        packed = self.host.peek(key)
        return None if packed is None else packed.num_pages

    def pages_of(self, handle: AdapterHandle) -> tuple[int, ...]:
        """The pool pages the published slot of `handle` reads."""
        return self.pool.slots.table.resolve(self.pool_handle(handle)).pages

    def mirror_publish(self, slot: int, slot_generation: int, pages: tuple[int, ...],
                       key: str, adapter: LoadedAdapter) -> list[torch.Tensor]:
        """A follower: write `adapter` (this rank's shard) into `pages` (the leader's
        placement of `slot`) and publish it to the address tables and the fold, as the
        leader's pool did. Returns the factors written, in page order (the rank's shard
        digest). AdapterError, with nothing published, when it does not fit."""
        if not 0 <= slot < self.max_slots:
            raise AdapterError("slot outside the pool's slots", slot=slot)
        self.engine.adapters.check_fits(adapter)
        packed = pack_adapter(key, factors_from_modules(adapter.modules),
                              self.layout.geometry, self.dtype)
        if packed.num_pages != len(pages):
            raise AdapterError(f"the shard needs {packed.num_pages} pages, the leader "
                               f"placed {len(pages)}", slot=slot)
        event = self.pool.storage.copy_in(pages, packed.payload)
        wait = getattr(event, "synchronize", None)
        if wait is not None:
            wait()  # the next plan reads the pages: the copy lands first
        self.pool.faults.hit(FaultPoint.VALIDATE, key=key)  # a rank's failed validation
        entry = PointerEntry(SlotHandle(slot, slot_generation, slot_generation, key),
                             slot_generation, pages, packed.plan)
        for listener in self.pool.listeners:
            listener.on_publish(entry)
        self._modules[slot] = frozenset((m.layer, m.module) for m in adapter.modules)
        self._mark_linears()
        return [packed.payload]

    def mirror_unpublish(self, slot: int) -> None:
        """A follower: the leader's pool unpublished `slot` (idempotent)."""
        for listener in self.pool.listeners:
            if listener is not self:
                listener.on_unpublish(slot)
        if self._modules.pop(slot, None) is not None:
            self._mark_linears()

    def collection_of(self, slot: int) -> str | None:
        return self.native.collection_of(slot)

    def gauges(self) -> dict[str, dict[str, int]]:
        return {**self.pool.gauges(), "reclaimable": {"pages": self.pool.reclaimable_pages()},
                "device_bytes": self.layout.device_bytes()}
