"""Where adapter factors live for the engine: two interchangeable slot backends.

* :class:`PoolSlots` (default): factors live in the unified page pool of
  :mod:`dataplane.pool`. A load packs the verified factors into a host image
  (:class:`~dataplane.pool.host_tier.HostTier`, digest re-checked), then one
  :func:`~dataplane.pool.transactions.admit` transaction reserves pages, copies,
  validates (layout, padded tails zero) and publishes one generation-stamped pointer
  table; :class:`~dataplane.pool.kernel_tables.KernelTables` (a slot listener) writes
  the kernels' row-address tables, which every LoRA linear reads instead of the
  engine's own factor tables. Each step's launch is fenced by
  `begin_launch`/`end_launch` on the slot handles it reads: a stale slot or pointer
  generation refuses the launch. The agent holds one pool reference per resident
  adapter, so the pool never picks an adapter the agent still serves as a victim.
* :class:`EngineSlots`: the engine's own per-slot factor tables
  (`Engine.register_loaded_adapter`).

Both hand back the engine's :class:`AdapterHandle` so requests bind to a slot the
engine's scheduler checks. KV blocks stay in the engine's block manager for now
(joint KV accounting needs the engine to take a `KvPageView`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

import torch

from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.engine import Engine
from dataplane.kernels.base import LoraModuleWeights
from dataplane.models.llama import LORA_GROUPS
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.events import CompletedEvent, CopyEvent
from dataplane.pool.host_tier import HostTier
from dataplane.pool.kernel_tables import KernelTables, ModuleGroup
from dataplane.pool.packing import factors_from_modules, pack_adapter
from dataplane.pool.page_demand import FactorShape, PageGeometry, adapter_page_demand
from dataplane.pool.slot_table import LaunchSnapshot, SlotHandle
from dataplane.pool.transactions import LoadRequest, admit


class SlotBackend(Protocol):
    def load(self, key: str, adapter: LoadedAdapter) -> AdapterHandle: ...

    def unload(self, handle: AdapterHandle) -> None: ...

    def begin_launch(self, row_slots: tuple[int, ...]) -> Any: ...

    def end_launch(self, snap: Any) -> None: ...

    def gauges(self) -> dict[str, dict[str, int]]: ...


class EngineSlots:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def load(self, key: str, adapter: LoadedAdapter) -> AdapterHandle:
        return self.engine.register_loaded_adapter(adapter)

    def unload(self, handle: AdapterHandle) -> None:
        self.engine.unregister_adapter(handle)

    def begin_launch(self, row_slots: tuple[int, ...]) -> Any:
        return None

    def end_launch(self, snap: Any) -> None:
        return None

    def gauges(self) -> dict[str, dict[str, int]]:
        return {}


@dataclass(frozen=True)
class _PoolFactors:
    """What a LoRA linear reads (`.weights`), backed by the pool's address tables."""

    weights: LoraModuleWeights


class PoolSlots:
    """Adapter slots in a :class:`DevicePool` (see module docstring)."""

    def __init__(self, engine: Engine, host_bytes: int = 1 << 30) -> None:
        self.engine = engine
        model, cfg = engine.model, engine.model.config
        shapes = cfg.module_shapes
        dtype = model.dtype
        device = model.embed_tokens.weight.device
        slots, max_rank = engine.config.max_slots, engine.config.max_rank
        elem = torch.tensor([], dtype=dtype).element_size()
        self.geometry = PageGeometry(page_elems=max(max(s) for s in shapes.values()),
                                     elem_bytes=elem)
        widest = [FactorShape(layer, module, max_rank, d_in, d_out, max_rank, Fraction(1))
                  for layer in range(cfg.num_layers)
                  for module, (d_out, d_in) in shapes.items()]
        # every slot can hold an all-module adapter at max rank (+1 page of packing slack)
        pages = slots * (adapter_page_demand(widest, self.geometry) + 1)
        self.host = HostTier(host_bytes)
        self.pool = DevicePool(self.geometry, pages, slots, dtype, device,
                               host_tier=self.host, full_audit=False)
        groups = [ModuleGroup(layer, attr, names, shapes[names[0]][1],
                              tuple(shapes[n][0] for n in names))
                  for layer in range(cfg.num_layers) for attr, names in LORA_GROUPS.items()]
        self.tables = KernelTables(self.pool.storage, groups, slots, max_rank)
        self.pool.listeners.append(self.tables)
        self._linears = model.lora_linears()
        for layer, attr, linear in self._linears:
            linear.factors = _PoolFactors(self.tables.weights(layer, attr))  # type: ignore[assignment]
        self._handles: dict[int, tuple[SlotHandle, str, int]] = {}
        self._modules: dict[int, frozenset[tuple[int, str]]] = {}
        self.dtype = dtype

    def load(self, key: str, adapter: LoadedAdapter) -> AdapterHandle:
        """Host image, then one admission transaction; returns the engine handle."""
        self.host.put(pack_adapter(key, factors_from_modules(adapter.modules), self.geometry,
                                   self.dtype))
        admission = admit(self.pool, LoadRequest(key))
        res = self.pool.residents[(key, admission.generation)]
        self.pool.acquire(res)  # the agent's hold: never an eviction victim while served
        slot = admission.handle.slot_id
        handle = AdapterHandle(slot, adapter.digest, admission.handle.slot_generation,
                               adapter.max_rank, adapter.source)
        # The engine's slot registry is what its scheduler and add_request check.
        self.engine.adapters._by_slot[slot] = handle
        self._handles[slot] = (admission.handle, key, admission.generation)
        self._modules[slot] = frozenset((m.layer, m.module) for m in adapter.modules)
        self._mark_linears()
        return handle

    def _mark_linears(self) -> None:
        """Host-side `has_factors` of each LoRA linear: some slot adapts one of its slices
        (the engine skips the LoRA call of linears without factors)."""
        adapted = set().union(*self._modules.values()) if self._modules else set()
        for layer, attr, linear in self._linears:
            linear.has_factors = any((layer, m) in adapted for m in LORA_GROUPS[attr])

    def unload(self, handle: AdapterHandle) -> None:
        """Retire the residency; it is reclaimed once no launch or fence holds it."""
        _, key, generation = self._handles.pop(handle.slot)
        self._modules.pop(handle.slot, None)
        self._mark_linears()
        del self.engine.adapters._by_slot[handle.slot]
        res = self.pool.residents[(key, generation)]
        self.pool.release_ref(res)
        self.pool.retire(res)

    def begin_launch(self, row_slots: tuple[int, ...]) -> LaunchSnapshot | None:
        used = {s for s in row_slots if s >= 0}
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

    def gauges(self) -> dict[str, dict[str, int]]:
        return {**self.pool.gauges(), "reclaimable": {"pages": self.pool.reclaimable_pages()}}
