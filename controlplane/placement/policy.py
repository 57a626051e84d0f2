"""Working-set consolidation (Punica) subject to KV feasibility. Pure functions, no DB.

Each agent has `adapter_slots` slots and a unified pool of `pool_pages` pages of
`page_bytes` bytes, of which `kv_reserve_pages` must stay available for KV (the
feasibility bound: placing an adapter must never leave less KV room than that).
An adapter occupies one slot and `ceil(bytes / page_bytes)` pages.

Policy, deterministic for equal inputs:

0. Hot adapters (an admin's per-alias mark), heaviest first (ties by digest), go to
   *every* compatible agent where they fit, each agent in agent-id order, before any
   held or other adapter: a publication to a hot alias is resident fleet-wide before
   the first request for it arrives. Rules 1-3 then place the other adapters in the
   room that is left, so a hot adapter may displace a held one.
1. Adapters an agent already holds (its last slot report, loads under way included) stay
   there while they fit (no churn: consolidation keeps the working set where it is) — at
   most `replicas` copies of an adapter with an observed request rate (agent-id order),
   so a replica count that falls frees the extra copies for eviction.
2. Remaining copies, heaviest adapter first, go to the compatible agent that already
   holds the most of the working set and still fits (consolidation onto few agents so
   requests for popular adapters batch together), ties broken by most free pages,
   then by agent id, never two copies on one agent. An adapter wants `replicas` copies
   (:func:`replica_targets`: one per fleet-average share of the request rate it draws,
   at most one per :data:`REPLICA_MIN_RPS`), one when no rate was observed.
3. An adapter that fits nowhere is left unplaced: agents still serve it on demand
   (cold load), placement only decides prefetch.

An agent is compatible when it serves the adapter's base, its max rank covers the
adapter's rank and its targets cover the adapter's target roles.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class AgentCapacity:
    agent_id: int
    h_base: str
    max_rank: int
    targets: frozenset[str]
    adapter_slots: int
    pool_pages: int
    page_bytes: int
    kv_reserve_pages: int
    holds: frozenset[str] = frozenset()
    """Artifact digests the agent reported resident."""


@dataclass(frozen=True)
class AdapterDemand:
    digest: str
    h_base: str
    rank: int
    roles: frozenset[str]
    nbytes: int
    hot: bool = False
    """Place on every compatible agent with room (rule 0)."""
    replicas: int | None = None
    """Copies wanted from the observed request rate (None: no rate observed)."""


@dataclass
class _Room:
    cap: AgentCapacity
    slots: int
    pages: int
    placed: set[str] = field(default_factory=set)

    def pages_for(self, a: AdapterDemand) -> int:
        return -(-a.nbytes // max(self.cap.page_bytes, 1))

    def compatible(self, a: AdapterDemand) -> bool:
        c = self.cap
        return c.h_base == a.h_base and a.rank <= c.max_rank and a.roles <= c.targets

    def fits(self, a: AdapterDemand) -> bool:
        need = self.pages_for(a)
        return self.slots >= 1 and self.pages - need >= self.cap.kv_reserve_pages

    def take(self, a: AdapterDemand) -> None:
        self.slots -= 1
        self.pages -= self.pages_for(a)
        self.placed.add(a.digest)


def place(adapters: Iterable[AdapterDemand],
          agents: Iterable[AgentCapacity]) -> dict[int, frozenset[str]]:
    """`{agent_id: digests to keep resident}` (see module docstring)."""
    rooms = sorted((_Room(c, c.adapter_slots, c.pool_pages) for c in agents),
                   key=lambda r: r.cap.agent_id)
    order = sorted(_unique(adapters), key=lambda a: (-a.nbytes, a.digest))
    for a in order:
        if a.hot:
            _place_everywhere(a, rooms)
    kept = {a.digest: _keep_held(a, rooms) for a in order if not a.hot}
    for a in order:
        if a.hot:
            continue
        for _ in range((a.replicas or 1) - kept[a.digest]):
            candidates = [r for r in rooms
                          if r.compatible(a) and r.fits(a) and a.digest not in r.placed]
            if not candidates:
                break
            best = max(candidates, key=lambda r: (len(r.placed), r.pages, -r.cap.agent_id))
            best.take(a)
    return {r.cap.agent_id: frozenset(r.placed) for r in rooms}


REPLICA_MIN_RPS = 4.0
"""Requests/s (smoothed over the agents' 30 s window) below which one copy takes an
adapter's whole load: a replica is only worth a slot and a load for more than that."""


def replica_targets(rates: Mapping[str, float], agents: int,
                    min_rps: float = REPLICA_MIN_RPS) -> dict[str, int]:
    """Copies per adapter from request rates (requests/s by digest, over a fleet of
    `agents` compatible agents): one per fleet-average share of the total rate it draws,
    ceil(rate x agents / total), but no more than one per `min_rps` of its own rate,
    between 1 and `agents`. Adapters without a positive rate are absent (placement then
    keeps their held copies and wants one)."""
    total = sum(r for r in rates.values() if r > 0)
    if total <= 0 or agents < 1:
        return {}
    return {d: max(1, min(agents, math.ceil(r * agents / total - 1e-9),
                          math.ceil(r / min_rps - 1e-9)))
            for d, r in rates.items() if r > 0}


def _unique(adapters: Iterable[AdapterDemand]) -> list[AdapterDemand]:
    """One demand per digest (the first seen), hot when any demand for it is hot (an
    artifact current for several aliases is hot if one of them is)."""
    unique: dict[str, AdapterDemand] = {}
    for a in adapters:
        seen = unique.setdefault(a.digest, a)
        if a.hot and not seen.hot:
            unique[a.digest] = replace(seen, hot=True)
    return list(unique.values())


def _place_everywhere(a: AdapterDemand, rooms: list[_Room]) -> None:
    """Rule 0: `a` on every compatible room where it fits."""
    for room in rooms:
        if room.compatible(a) and room.fits(a):
            room.take(a)


def _keep_held(a: AdapterDemand, rooms: list[_Room]) -> int:
    """Rule 1: `a` stays on the rooms that hold it and still fit it (at most `replicas`
    of them when set); how many kept it."""
    kept = 0
    for room in rooms:
        if a.replicas is not None and kept >= a.replicas:
            break
        if a.digest in room.cap.holds and room.compatible(a) and room.fits(a):
            room.take(a)
            kept += 1
    return kept


def capacity_from_record(agent_id: int, h_base: str, capabilities: Mapping[str, object],
                         holds: Iterable[str]) -> AgentCapacity:
    """Capacity from an agent's registration record (missing numbers mean 'none')."""
    def num(key: str, default: int = 0) -> int:
        value = capabilities.get(key, default)
        return int(value) if isinstance(value, int | float) else default

    targets = capabilities.get("targets", [])
    return AgentCapacity(
        agent_id=agent_id, h_base=h_base, max_rank=num("max_rank"),
        targets=frozenset(str(t) for t in targets) if isinstance(targets, list) else frozenset(),
        adapter_slots=num("adapter_slots"), pool_pages=num("pool_pages"),
        page_bytes=num("page_bytes", 1), kv_reserve_pages=num("kv_reserve_pages"),
        holds=frozenset(holds))
