"""Unified adapter + KV page pool, residency transactions and the host tier.

Layers (docs/ARCHITECTURE.md, "The unified pool"):

* bookkeeping, torch-free: :mod:`page_pool` (page states and owners, conservation),
  :mod:`page_demand` (demand from tensor shapes, admission inequality),
  :mod:`residency` (state machine), :mod:`eviction` (eligibility, then LRU ranking),
  :mod:`slot_table` (slot/pointer generations, pointer-table snapshots, launches),
  :mod:`events`, :mod:`faults`;
* physical: :mod:`packing` (host page images), :mod:`page_storage` (the pool tensor,
  side-stream copies), :mod:`unified` (page size from the KV block; the engine's KV
  cache as page-major views of the same tensor: one buffer for KV and adapters),
  :mod:`kernel_tables` (the kernels' row-address tables),
  :mod:`host_tier` (pinned LRU + digest-keyed disk cache);
* orchestration: :mod:`device_pool` (state + small ops; :mod:`pool_invariants` its
  conservation checks, :mod:`pool_reporting` its stats and gauges), :mod:`transactions`
  (reserve -> copy -> validate -> publish, compensating rollback). Requests bind to
  exact generations through the engine's ``dataplane.engine.pool_slots``.

Errors: :mod:`errors` (``PoolError``, under ``dataplane.errors.EngineError``).
"""

from __future__ import annotations
