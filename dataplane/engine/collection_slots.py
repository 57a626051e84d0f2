"""Load a Compress-then-Serve collection bundle into the engine, served natively.

A member keeps its own adapter slot (so requests, the scheduler and the prefix cache treat
it like any adapter) but its factors are not a LoRA: the slot's LoRA ranks stay 0 and the
runner's `CollectionTable`s hold the cluster's shared bases once, in a basis block, and the
member's core at its slot (dataplane/layers/collection_table.py).

A load is one transaction: the bundle is verified (`read_bundle` re-derives
every basis/core digest), every check — base, rank, module shapes, free blocks, free slots —
passes before the first write, the bases and cores are written into blocks and slots no row
can read, and only then are the member handles bound, all at once. A core is therefore never
visible with another basis than the one it was fitted with, and a refused load changes
nothing. Each member's identity binds the collection: ``H_member = digest(H_collection,
member index, core digest)``, served as ``H_adapter_semantic(H_base, H_member)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from dataplane.collections.bundle import CollectionBundle, read_bundle
from dataplane.collections.errors import CollectionError
from dataplane.engine.adapters import AdapterHandle, AdapterRegistry, Placed, projection_of
from dataplane.identity import digest, h_adapter_semantic
from dataplane.layers.collection_table import CollectionTable
from dataplane.models.llama import LORA_GROUPS

COLLECTION_FAMILY = "collection-torch"
"""The kernels that read a member's slot: the three-stage torch ops of CollectionTable."""

Placement = dict[str, tuple[tuple[int, str], int]]
"""Bundle module name -> ((layer, fused projection), slice index)."""


class RunnerWithCollections(Protocol):
    collections: dict[tuple[int, str], CollectionTable]


def member_identity(h_collection: str, index: int, core_digest: str) -> str:
    """H_member: the collection, the member's position in it and its core (bound to its
    basis by the bundle's core digest)."""
    return digest({"h_collection": h_collection, "member": index, "core_digest": core_digest})


@dataclass(frozen=True)
class CollectionHandle:
    """Members of a loaded collection: its identity, cluster -> basis block, and one adapter
    handle per member asked for (in that order; `indices` are their bundle positions)."""

    h_collection: str
    blocks: dict[int, int]
    indices: tuple[int, ...]
    members: tuple[AdapterHandle, ...]


@dataclass
class _Resident:
    """One collection's resident state: its clusters' blocks and its bound members."""

    assignment: tuple[int, ...]
    blocks: dict[int, int] = field(default_factory=dict)
    members: dict[int, AdapterHandle] = field(default_factory=dict)


class CollectionRegistry:
    """Which collection occupies which basis blocks and member slots of one runner.

    Members come and go one at a time; a cluster's basis block stays resident while one of
    its members is loaded (a block is shared, a core is not)."""

    def __init__(self, runner: RunnerWithCollections, adapters: AdapterRegistry,
                 h_base: str) -> None:
        self.tables = runner.collections
        self.adapters = adapters
        self.h_base = h_base
        self.slots: range | None = None
        """The adapter slots members may take (None: any free one). The agent's unified
        pool allocates slots below its own count and gives members the ones above."""
        self._resident: dict[str, _Resident] = {}
        any_table = next(iter(self.tables.values()), None)
        self.blocks = any_table.blocks if any_table is not None else 0
        self.rank = any_table.rank if any_table is not None else 0
        self._block_bytes = sum(  # one block: NS·R rows of Vᵀ and of Uᵀ in every table
            len(t.out_features) * t.rank * (t.vt.shape[1] + t.ut.shape[1]) * t.vt.element_size()
            for t in self.tables.values())
        self._core_bytes = sum(t.cores[0].numel() * t.cores.element_size()
                               for t in self.tables.values())

    @property
    def loaded(self) -> dict[str, dict[int, AdapterHandle]]:
        """H_collection -> its bound members by bundle position."""
        return {h: dict(r.members) for h, r in self._resident.items()}

    def blocks_in_use(self) -> dict[str, dict[int, int]]:
        """H_collection -> cluster -> basis block, for resident clusters."""
        return {h: dict(r.blocks) for h, r in self._resident.items()}

    def resident_bytes(self) -> int:
        """Device bytes the resident collections use: their blocks' bases in every table
        and their members' cores (the tables' capacity is allocated up front)."""
        blocks = sum(len(r.blocks) for r in self._resident.values())
        members = sum(len(r.members) for r in self._resident.values())
        return blocks * self._block_bytes + members * self._core_bytes

    def member_slots(self) -> set[int]:
        return {m.slot for r in self._resident.values() for m in r.members.values()}

    def load(self, source: CollectionBundle | str | Path,
             members: Iterable[int] | None = None,
             served_as: Mapping[int, Placed] | None = None) -> CollectionHandle:
        """Serve `members` (bundle positions; None: all) of a bundle or bundle directory.
        Members already loaded keep their handles; the others are added, with the basis
        blocks of clusters not resident yet, in one all-or-nothing step. `served_as`: the
        adapter a member is served as (an agent serving a published member artifact passes
        the artifact's: its semantic digest and module specs, which the slot's
        H_kernel_local then records); default: `member_identity`, no kernel record."""
        bundle = source if isinstance(source, CollectionBundle) else read_bundle(Path(source))
        if not self.tables:
            raise CollectionError("this engine serves no collections natively "
                                  "(EngineConfig.collection_blocks = 0)")
        h_collection = bundle.h_collection
        count = len(bundle.assignment)
        indices = tuple(range(count)) if members is None else tuple(members)
        if not indices or len(set(indices)) != len(indices) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < count
                for i in indices):
            raise CollectionError("members must be distinct positions in the collection",
                                  members=list(indices), size=count)
        placement = self._check(bundle)
        resident = self._resident.get(h_collection) or _Resident(tuple(bundle.assignment))
        cores = bundle.manifest["core_digests"]
        given = served_as or {}
        served = {i: given[i].digest if i in given else h_adapter_semantic(
            self.h_base, member_identity(h_collection, i, str(cores[i]))) for i in indices}
        clash = [i for i in indices if i in resident.members
                 and resident.members[i].digest != served[i]]
        if clash:
            raise CollectionError("members are already served under another identity",
                                  members=clash)
        new = [i for i in indices if i not in resident.members]
        clusters = sorted({bundle.assignment[i] for i in new} - set(resident.blocks))
        used = {b for r in self._resident.values() for b in r.blocks.values()}
        free_blocks = [b for b in range(self.blocks) if b not in used]
        free_slots = [s for s in self.adapters.free_slots()
                      if self.slots is None or s in self.slots]
        if len(free_blocks) < len(clusters) or len(free_slots) < len(new):
            raise CollectionError("not enough free basis blocks or adapter slots",
                                  blocks_needed=len(clusters), blocks_free=len(free_blocks),
                                  slots_needed=len(new), slots_free=len(free_slots))
        added = dict(zip(clusters, free_blocks, strict=False))
        blocks = {**resident.blocks, **added}
        slots = dict(zip(new, free_slots, strict=False))
        try:
            self._write(bundle, placement, added, {i: (s, blocks[bundle.assignment[i]])
                                                   for i, s in slots.items()})
        except Exception:
            self._clear(added.values(), slots.values())
            raise
        for i in new:  # publication: the bound handles make the new members reachable
            handle = AdapterHandle(slots[i], served[i], self.adapters.next_generation(slots[i]),
                                   self.rank, f"collection:{h_collection}:{i}")
            self.adapters.bind(handle, given.get(i), packing=f"collection:{h_collection}",
                                        family=COLLECTION_FAMILY)
            resident.members[i] = handle
        resident.blocks = blocks
        self._resident[h_collection] = resident
        self._refresh_active()
        return CollectionHandle(h_collection, dict(blocks), indices,
                                tuple(resident.members[i] for i in indices))

    def unload(self, handle: CollectionHandle, live_slots: set[int]) -> None:
        """Free the handle's member slots, and the basis blocks no member still reads;
        refused (nothing changes) for a stale handle or while a live request uses one of
        its members."""
        resident = self._resident.get(handle.h_collection)
        if resident is None or any(resident.members.get(i) != m for i, m in
                                   zip(handle.indices, handle.members, strict=True)):
            raise CollectionError("collection handle is not loaded (stale or foreign)",
                                  h_collection=handle.h_collection)
        busy = sorted(m.slot for m in handle.members if m.slot in live_slots)
        if busy:
            raise CollectionError("collection members are used by live requests",
                                  slots=busy)
        for i, member in zip(handle.indices, handle.members, strict=True):
            self.adapters.release(member)
            del resident.members[i]
        still = {resident.assignment[i] for i in resident.members}
        freed = [b for c, b in resident.blocks.items() if c not in still]
        resident.blocks = {c: b for c, b in resident.blocks.items() if c in still}
        self._clear(freed, (m.slot for m in handle.members))
        if not resident.members:
            del self._resident[handle.h_collection]
        self._refresh_active()

    # ----- internals -----------------------------------------------------------------------
    def _check(self, bundle: CollectionBundle) -> Placement:
        if bundle.manifest.get("h_base") != self.h_base:
            raise CollectionError("the collection was fitted on another base model",
                                  bundle_h_base=bundle.manifest.get("h_base"),
                                  engine_h_base=self.h_base)
        rank = int(bundle.manifest["rank"])
        if rank > self.rank:
            raise CollectionError(f"collection rank {rank} exceeds the engine's "
                                  f"collection_rank {self.rank}", rank=rank)
        placement: Placement = {}
        for entry in bundle.manifest["modules"]:
            name = str(entry["name"])
            where = projection_of(name)
            found = None if where is None else next(
                (((where[0], attr), k) for attr, group in LORA_GROUPS.items()
                 for k, module in enumerate(group) if module == where[1]), None)
            table = None if found is None else self.tables.get(found[0])
            if found is None or table is None:
                raise CollectionError(f"module {name!r} is not a projection of this model",
                                      module=name)
            shape = (table.out_features[found[1]], table.in_features)
            if (int(entry["d_out"]), int(entry["d_in"])) != shape:
                raise CollectionError(f"module {name!r}: shape does not fit the model",
                                      module=name, expected=list(shape))
            placement[name] = found
        return placement

    def _write(self, bundle: CollectionBundle, placement: Placement, blocks: dict[int, int],
               slots: dict[int, tuple[int, int]]) -> None:
        """Bases of `blocks` (cluster -> block) and each new member's core (index -> (slot,
        block)), into places no row reads yet."""
        bases: dict[tuple[int, str], dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]]
        bases = {}
        for cluster in blocks:
            for name, (key, k) in placement.items():
                bases.setdefault(key, {}).setdefault(cluster, {})[k] = bundle.bases(cluster, name)
        for key, by_cluster in bases.items():
            for cluster, per_slice in by_cluster.items():
                self.tables[key].write_block(blocks[cluster], per_slice)
        for i, (slot, block) in slots.items():
            cores: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
            for name, (key, k) in placement.items():
                cores.setdefault(key, {})[k] = bundle.core(i, name)
            for key, table in self.tables.items():
                table.write_core(slot, block, cores.get(key, {}))

    def _clear(self, blocks: Iterable[int], slots: Iterable[int]) -> None:
        blocks, slots = list(blocks), list(slots)
        for table in self.tables.values():
            for b in blocks:
                table.clear_block(b)
            for s in slots:
                table.clear_core(s)

    def _refresh_active(self) -> None:
        for table in self.tables.values():
            table.active = bool(self._resident)
