"""Which agent serves a request: pure functions over the fleet's last report.

A request names one adapter (its artifact digest, base, rank and target roles) or the bare
base model. :func:`route` orders the agents to try, first choice first (the rest are the
failover order):

1. **Feasible**: heartbeat within the lease, not draining, not marked down by this router
   (a connection failure or 5xx a moment ago), same base, max rank and targets that cover
   the adapter.
2. **Holders first**: agents that hold the adapter resident (their heartbeat says so) or
   that this router sent it to cold a moment ago (its load is under way there), least
   loaded first, except *busy* holders: over the load bound (rule 3) both in this
   router's count and in their last heartbeat. A cold adapter requested many times at
   once is loaded once; a hot one spreads: when every holder is busy the request goes
   to the first agent of rule 3, which loads it (one more replica), so an adapter gets
   as many replicas as its request rate needs, on the agents its ring walk names (the
   same ones from every router), also between placement's updates (the copies placement
   assigns are holders too: the control plane lists them as resident). Busy holders
   come after rule 3's agents within the bound, before those over it.
3. **Then the others by bounded-load consistent hashing** on the adapter digest: the
   agents in the order of a hash ring walked from the digest's point, those whose load is
   within `load_factor` x the mean load of the feasible agents (plus one) first. Every
   router computes the same ring from the same agent list, so one cold adapter goes to
   one agent fleet-wide, while the bound keeps a popular ring point from piling
   everything on one agent.

Load is what this router has in flight at the agent now: exact and current. A
heartbeat's load is seconds old and every router reads the same one, so balancing on it
sends every router to the agents that were idle at the last heartbeat (a herd:
docs/PERFORMANCE.md, "Fleet routing (simulated)"); a load balancer spreads requests over
the routers, so each one balancing its own requests balances their sum. The heartbeat's
load only confirms that a holder is busy before a replica is added (one router's counts
are small and noisy when there are many routers).
A base-model request has no digest: every feasible agent serving that base, least
loaded first.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

VIRTUAL_NODES = 64
"""Points per agent on the hash ring (spreads digests evenly over few agents)."""
LOAD_FACTOR = 1.25
"""Bounded-load factor: a cold adapter skips agents above this x the mean load (+1), and a
holder above it (in this router's count and its heartbeat) is skipped for a new replica."""


@dataclass(frozen=True)
class AgentView:
    """One agent as the routing table holds it."""

    agent_id: int
    base: str
    max_rank: int
    targets: frozenset[str]
    resident: frozenset[str]
    reported_load: int
    """Live + waiting requests at its last heartbeat."""
    heartbeat_age_s: float
    drain: bool = False
    free_pages: int = 0
    arriving: frozenset[str] = frozenset()
    """Adapters loading there or assigned to it by placement, not resident yet."""


@dataclass(frozen=True)
class Target:
    """What a request needs: an adapter (digest, rank, roles) or the base (digest None)."""

    base: str
    digest: str | None = None
    rank: int = 0
    roles: frozenset[str] = frozenset()


@dataclass
class LocalView:
    """The router's own short-lived knowledge: requests in flight per agent, cold
    adapters it sent somewhere (until the mark lapses; once that agent's heartbeat lists
    the adapter it is a holder anyway), and agents that failed a moment ago."""

    inflight: dict[int, int] = field(default_factory=dict)
    sent_cold: dict[str, tuple[int, float]] = field(default_factory=dict)
    """digest -> (agent id, monotonic time the mark lapses)."""
    down_until: dict[int, float] = field(default_factory=dict)

    def load(self, agent: AgentView) -> int:
        """This router's requests in flight at `agent` (exact and current; see the
        module docstring for why the heartbeat's load is not added)."""
        return self.inflight.get(agent.agent_id, 0)

    def is_down(self, agent_id: int, now: float) -> bool:
        return self.down_until.get(agent_id, 0.0) > now

    def pending_holder(self, digest: str, now: float) -> int | None:
        mark = self.sent_cold.get(digest)
        if mark is None:
            return None
        if mark[1] <= now:
            del self.sent_cold[digest]
            return None
        return mark[0]


def feasible(agent: AgentView, target: Target, lease_s: float) -> bool:
    """Routable at all for `target` (rule 1, without the router-local down mark)."""
    if agent.drain or agent.heartbeat_age_s > lease_s or agent.base != target.base:
        return False
    return target.digest is None or (target.rank <= agent.max_rank
                                     and target.roles <= agent.targets)


def route(target: Target, agents: Iterable[AgentView], local: LocalView, now: float,
          lease_s: float, load_factor: float = LOAD_FACTOR) -> list[AgentView]:
    """The agents to try for `target`, in order (see module docstring); empty when none
    is feasible."""
    ok = [a for a in agents if feasible(a, target, lease_s) and not local.is_down(a.agent_id,
                                                                                  now)]
    if not ok:
        return []
    load = {a.agent_id: local.load(a) for a in ok}
    by_load = sorted(ok, key=lambda a: (load[a.agent_id], -a.free_pages, a.agent_id))
    if target.digest is None:
        return by_load
    pending = local.pending_holder(target.digest, now)
    holders = [a for a in by_load if target.digest in a.resident
               or target.digest in a.arriving or a.agent_id == pending]
    bound = _bound(sum(load.values()), len(ok), load_factor)
    reported_bound = _bound(sum(a.reported_load for a in ok), len(ok), load_factor)
    # only a holder with the adapter in its pool can be busy: one still loading it would
    # take a second load as long to help as its own to finish
    busy = {a.agent_id for a in holders
            if target.digest in a.resident and load[a.agent_id] >= bound
            and a.reported_load >= reported_bound}
    held = {a.agent_id for a in holders}
    rest = {a.agent_id: a for a in ok if a.agent_id not in held}
    walk = [rest[i] for i in ring_of(frozenset(load)).walk(target.digest) if i in rest]
    return ([a for a in holders if a.agent_id not in busy]
            + [a for a in walk if load[a.agent_id] < bound]
            + [a for a in holders if a.agent_id in busy]
            + [a for a in walk if load[a.agent_id] >= bound])


def load_bound(agents: Sequence[AgentView], local: LocalView,
               load_factor: float = LOAD_FACTOR) -> int:
    """The bounded-load cap over `agents`: `load_factor` x their mean load (+1), rounded
    up; an agent is within it when its load is below it."""
    return _bound(sum(local.load(a) for a in agents), len(agents), load_factor)


def _bound(total: int, count: int, load_factor: float) -> int:
    return math.ceil(load_factor * (total + 1) / max(count, 1))


def bounded_ring_order(digest: str, agents: Sequence[AgentView], local: LocalView,
                       load_factor: float = LOAD_FACTOR) -> list[AgentView]:
    """`agents` in hash-ring order from `digest`'s point, those within
    :func:`load_bound` over `agents` first (bounded-load consistent hashing)."""
    if not agents:
        return []
    by_id = {a.agent_id: a for a in agents}
    walk = [by_id[i] for i in ring_of(frozenset(by_id)).walk(digest)]
    bound = load_bound(agents, local, load_factor)
    return ([a for a in walk if local.load(a) < bound]
            + [a for a in walk if local.load(a) >= bound])


class HashRing:
    """A consistent-hash ring of agent ids with :data:`VIRTUAL_NODES` points each."""

    def __init__(self, agent_ids: Iterable[int], virtual_nodes: int = VIRTUAL_NODES) -> None:
        points = sorted((_point(f"{agent_id}#{v}"), agent_id)
                        for agent_id in set(agent_ids) for v in range(virtual_nodes))
        self._keys = [p for p, _ in points]
        self._ids = [i for _, i in points]
        self._count = len(set(self._ids))
        self._walks: dict[int, tuple[int, ...]] = {}
        """Walk by start point (at most one per point; a ring is reused across calls)."""

    def walk(self, key: str) -> tuple[int, ...]:
        """Every agent id once, clockwise from `key`'s point."""
        if not self._ids:
            return ()
        n = len(self._ids)
        start = bisect.bisect_left(self._keys, _point(key)) % n
        cached = self._walks.get(start)
        if cached is not None:
            return cached
        seen: dict[int, None] = {}
        for k in range(n):
            seen.setdefault(self._ids[(start + k) % n], None)
            if len(seen) == self._count:
                break
        walk = self._walks[start] = tuple(seen)
        return walk


@functools.lru_cache(maxsize=8)
def ring_of(agent_ids: frozenset[int]) -> HashRing:
    """The ring of `agent_ids`, built once per distinct set (4,096 hashes for 64 agents,
    milliseconds: too slow to repeat per request)."""
    return HashRing(agent_ids)


def _point(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def resident_counts(agents: Iterable[AgentView]) -> Mapping[str, int]:
    """digest -> how many agents hold it (replicas)."""
    counts: dict[str, int] = {}
    for a in agents:
        for d in a.resident:
            counts[d] = counts.get(d, 0) + 1
    return counts
