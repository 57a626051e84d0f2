"""agent/router/routing.py: feasibility, holders first, the hash ring, bounded load, cold
marks, base requests, and a property over random fleets.

Expected orders come from a brute-force ring computed here from sha256 (each agent's
clockwise distance from the key to its nearest point), not from the module's ring.
"""

from __future__ import annotations

import hashlib
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.router.routing import (
    LOAD_FACTOR,
    VIRTUAL_NODES,
    AgentView,
    LocalView,
    Target,
    route,
)

BASE = "h-base"
ROLES = frozenset({"q_proj", "v_proj", "o_proj"})
LEASE = 10.0
NOW = 1000.0


def view(agent_id: int, *, resident: tuple[str, ...] = (), reported: int = 0,
         age: float = 0.5, drain: bool = False, base: str = BASE, max_rank: int = 16,
         targets: frozenset[str] = ROLES, free_pages: int = 0) -> AgentView:
    return AgentView(agent_id=agent_id, base=base, max_rank=max_rank, targets=targets,
                     resident=frozenset(resident), reported_load=reported,
                     heartbeat_age_s=age, drain=drain, free_pages=free_pages)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def adapter(d: str, rank: int = 8, roles: frozenset[str] = frozenset({"q_proj"})) -> Target:
    return Target(base=BASE, digest=d, rank=rank, roles=roles)


def point(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def brute_ring(key: str, ids: list[int]) -> list[int]:
    """Agents by the clockwise distance from `key`'s point to their nearest point."""
    k = point(key)
    dist = {i: min((point(f"{i}#{v}") - k) % 2**64 for v in range(VIRTUAL_NODES))
            for i in ids}
    return sorted(ids, key=lambda i: (dist[i], i))


def ids(order: list[AgentView]) -> list[int]:
    return [a.agent_id for a in order]


# ----- rule 1: feasibility ----------------------------------------------------------
def test_infeasible_agents_are_left_out() -> None:
    d = digest("feasibility")
    agents = [
        view(1),
        view(2, age=LEASE + 0.1),                            # lease lapsed
        view(3, age=LEASE),                                  # at the lease: still in
        view(4, drain=True),
        view(5, base="other-base"),
        view(6, max_rank=4),                                 # rank 8 needed
        view(7, targets=frozenset({"v_proj"})),              # q_proj needed
        view(8),                                             # marked down below
        view(9),                                             # down mark lapsed
    ]
    local = LocalView(down_until={8: NOW + 1.0, 9: NOW - 0.1})
    assert sorted(ids(route(adapter(d), agents, local, NOW, LEASE))) == [1, 3, 9]


def test_base_request_ignores_rank_and_targets_but_not_base() -> None:
    agents = [view(1, max_rank=1, targets=frozenset()), view(2, base="other"), view(3)]
    order = route(Target(base=BASE), agents, LocalView(), NOW, LEASE)
    assert sorted(ids(order)) == [1, 3]


def test_no_feasible_agent_gives_empty_order() -> None:
    assert route(adapter(digest("x")), [view(1, drain=True)], LocalView(), NOW, LEASE) == []
    assert route(adapter(digest("x")), [], LocalView(), NOW, LEASE) == []


# ----- rule 2: holders first ------------------------------------------------------------
def test_holders_first_least_loaded_first() -> None:
    d = digest("held")
    agents = [view(i, resident=(d,) if i in (2, 5) else ()) for i in range(1, 7)]
    local = LocalView(inflight={2: 3, 5: 1, 1: 0, 3: 0})
    order = ids(route(adapter(d), agents, local, NOW, LEASE))
    assert order[:2] == [5, 2]
    assert sorted(order[2:]) == [1, 3, 4, 6]


def test_holders_order_by_this_routers_count_not_the_heartbeat() -> None:
    d = digest("held-stale")
    agents = [view(1, resident=(d,), reported=50), view(2, resident=(d,), reported=0),
              view(3)]
    local = LocalView(inflight={1: 1, 2: 2})
    assert ids(route(adapter(d), agents, local, NOW, LEASE))[:2] == [1, 2]


def test_holder_ties_break_on_free_pages_then_id() -> None:
    d = digest("ties")
    agents = [view(3, resident=(d,), free_pages=10), view(1, resident=(d,), free_pages=10),
              view(2, resident=(d,), free_pages=20)]
    assert ids(route(adapter(d), agents, LocalView(), NOW, LEASE)) == [2, 1, 3]


# ----- rule 3: the ring -----------------------------------------------------------------
def test_cold_order_is_the_ring_and_two_routers_agree() -> None:
    agents = [view(i) for i in range(1, 9)]
    for n in range(20):
        d = digest(f"cold-{n}")
        expected = brute_ring(d, list(range(1, 9)))
        first = ids(route(adapter(d), agents, LocalView(), NOW, LEASE))
        second = ids(route(adapter(d), list(reversed(agents)), LocalView(), NOW + 5, LEASE))
        assert first == second == expected


def test_ring_order_of_the_others_skips_holders_only() -> None:
    """With holders taken out, the rest follow the ring of the rest alone."""
    agents = [view(i, resident=(digest(f"h-{i}"),)) for i in range(1, 9)]
    for n in range(20):
        d = digest(f"h-{n % 8 + 1}")
        holder = n % 8 + 1
        order = ids(route(adapter(d), agents, LocalView(), NOW, LEASE))
        assert order[0] == holder
        assert order[1:] == brute_ring(d, [i for i in range(1, 9) if i != holder])


def test_adding_an_agent_moves_about_one_in_n_first_choices() -> None:
    rng = random.Random(7)
    digests = [digest(f"{rng.random()}") for _ in range(2000)]
    four = [view(i) for i in range(1, 5)]
    five = [*four, view(5)]
    before = {d: ids(route(adapter(d), four, LocalView(), NOW, LEASE))[0] for d in digests}
    after = {d: ids(route(adapter(d), five, LocalView(), NOW, LEASE))[0] for d in digests}
    moved = {d for d in digests if before[d] != after[d]}
    # consistent hashing: what moves, moves to the new agent; nothing else changes
    assert all(after[d] == 5 for d in moved)
    assert moved == {d for d in digests if brute_ring(d, [1, 2, 3, 4, 5])[0] == 5}
    assert 0.15 <= len(moved) / len(digests) <= 0.25


def test_first_choices_spread_over_agents() -> None:
    agents = [view(i) for i in range(1, 9)]
    counts = dict.fromkeys(range(1, 9), 0)
    for n in range(4000):
        counts[ids(route(adapter(digest(f"s{n}")), agents, LocalView(), NOW, LEASE))[0]] += 1
    assert min(counts.values()) > 4000 / 8 * 0.6
    assert max(counts.values()) < 4000 / 8 * 1.4


# ----- bounded load -------------------------------------------------------------------
def within(load: int, total: int, n: int) -> bool:
    return load < LOAD_FACTOR * (total + 1) / n


def test_an_agent_above_the_bound_moves_after_those_within() -> None:
    d = digest("bounded")
    ring = brute_ring(d, [1, 2, 3, 4])
    agents = [view(i) for i in range(1, 5)]
    inflight = {ring[0]: 10, ring[1]: 3}
    assert not within(10, 13, 4) and within(3, 13, 4)     # bound: 1.25 x 14 / 4 = 4.375
    order = ids(route(adapter(d), agents, LocalView(inflight=dict(inflight)), NOW, LEASE))
    assert order == [ring[1], ring[2], ring[3], ring[0]]


def test_bound_is_strict_at_the_edge() -> None:
    d = digest("edge")
    ring = brute_ring(d, [1, 2, 3, 4])
    agents = [view(i) for i in range(1, 5)]
    # total 7: 1.25 x 8 / 4 = 2.5, so a load of 3 is over it and 2 within
    for first_load, expect_first in ((3, False), (2, True)):
        inflight = {ring[0]: first_load, ring[1]: 7 - first_load - 2, ring[2]: 2}
        assert within(first_load, 7, 4) is expect_first
        order = ids(route(adapter(d), agents, LocalView(inflight=inflight), NOW, LEASE))
        assert (order[0] == ring[0]) is expect_first


def test_busy_holder_spills_to_the_ring_for_a_replica() -> None:
    d = digest("hot")
    others = [2, 3, 4, 5]
    ring = brute_ring(d, others)
    agents = [view(1, resident=(d,), reported=40), *(view(i, reported=5) for i in others)]
    local = LocalView(inflight={1: 12, 2: 1, 3: 1, 4: 1, 5: 1})
    # over the bound in both this router's count (1.25 x 17 / 5 = 4.25) and the
    # heartbeats (1.25 x 61 / 5 = 15.25): after the others within the bound
    assert ids(route(adapter(d), agents, local, NOW, LEASE)) == [*ring, 1]


def test_busy_holder_comes_before_others_over_the_bound() -> None:
    d = digest("hot-2")
    agents = [view(1, resident=(d,), reported=40), view(2, reported=0), view(3, reported=0)]
    local = LocalView(inflight={1: 9, 2: 9, 3: 0})     # bound 1.25 x 19 / 3 = 7.9
    order = ids(route(adapter(d), agents, local, NOW, LEASE))
    assert order == [3, 1, 2]


def test_holder_over_the_bound_in_one_signal_only_stays_first() -> None:
    d = digest("noisy")
    # over in this router's count, not in the heartbeats (a small, noisy count)
    agents = [view(1, resident=(d,), reported=5), view(2, reported=5), view(3, reported=5)]
    local = LocalView(inflight={1: 6, 2: 0, 3: 0})
    assert ids(route(adapter(d), agents, local, NOW, LEASE))[0] == 1
    # over in the heartbeats, not in this router's count
    agents = [view(1, resident=(d,), reported=60), view(2), view(3)]
    assert ids(route(adapter(d), agents, LocalView(), NOW, LEASE))[0] == 1


# ----- the pending mark -----------------------------------------------------------------
def test_sent_cold_makes_the_agent_a_holder_until_it_lapses() -> None:
    d = digest("pending")
    ring = brute_ring(d, [1, 2, 3, 4])
    target = ring[2]
    agents = [view(i) for i in range(1, 5)]
    local = LocalView(inflight={target: 2, ring[0]: 0},
                      sent_cold={d: (target, NOW + 30.0)})
    assert ids(route(adapter(d), agents, local, NOW, LEASE))[0] == target
    assert ids(route(adapter(d), agents, local, NOW + 29.9, LEASE))[0] == target
    # lapsed: the ring again, where its 2 in flight are over the bound (1.25 x 3 / 4)
    assert ids(route(adapter(d), agents, local, NOW + 30.0, LEASE)) == [
        *(i for i in ring if i != target), target]
    assert d not in local.sent_cold


def test_sent_cold_to_an_infeasible_agent_is_ignored() -> None:
    d = digest("pending-drained")
    agents = [view(1), view(2), view(3, drain=True)]
    local = LocalView(sent_cold={d: (3, NOW + 30.0)})
    assert ids(route(adapter(d), agents, local, NOW, LEASE)) == brute_ring(d, [1, 2])


# ----- base requests --------------------------------------------------------------------
def test_base_request_goes_least_loaded_ignoring_residency() -> None:
    agents = [view(1, resident=("x",)), view(2, free_pages=5), view(3), view(4, free_pages=9)]
    local = LocalView(inflight={1: 4, 2: 1, 3: 0, 4: 1})
    assert ids(route(Target(base=BASE), agents, local, NOW, LEASE)) == [3, 4, 2, 1]


# ----- property: every feasible agent exactly once ----------------------------------
POOL = [digest(f"pool-{i}") for i in range(6)]
agent_st = st.builds(
    lambda resident, reported, age, drain, base, rank, targets, free: (
        resident, reported, age, drain, base, rank, targets, free),
    st.frozensets(st.sampled_from(POOL), max_size=3), st.integers(0, 50),
    st.floats(0, 2 * LEASE), st.booleans(), st.sampled_from([BASE, BASE, "other"]),
    st.sampled_from([4, 8, 16]), st.frozensets(st.sampled_from(sorted(ROLES)), min_size=1),
    st.integers(0, 100))


@settings(max_examples=300, deadline=None)
@given(fleet=st.lists(agent_st, max_size=12), d=st.sampled_from([*POOL, None]),
       rank=st.sampled_from([4, 8, 16]), inflight=st.lists(st.integers(0, 20), min_size=12,
                                                           max_size=12),
       down=st.frozensets(st.integers(0, 11), max_size=3),
       pending=st.one_of(st.none(), st.integers(0, 11)))
def test_every_feasible_agent_appears_exactly_once(
        fleet: list[tuple], d: str | None, rank: int, inflight: list[int],
        down: frozenset[int], pending: int | None) -> None:
    agents = [view(i, resident=tuple(r), reported=rep, age=age, drain=dr, base=b,
                   max_rank=mr, targets=frozenset(t), free_pages=f)
              for i, (r, rep, age, dr, b, mr, t, f) in enumerate(fleet)]
    target = Target(base=BASE) if d is None else adapter(d, rank, frozenset({"q_proj"}))
    local = LocalView(inflight=dict(enumerate(inflight)),
                      down_until={i: NOW + 1 for i in down},
                      sent_cold={} if d is None or pending is None
                      else {d: (pending, NOW + 5)})
    order = ids(route(target, agents, local, NOW, LEASE))
    feasible_ids = {
        a.agent_id for a in agents
        if not a.drain and a.heartbeat_age_s <= LEASE and a.base == BASE
        and a.agent_id not in down
        and (d is None or (rank <= a.max_rank and "q_proj" in a.targets))}
    assert len(order) == len(set(order))
    assert set(order) == feasible_ids
    if d is not None and order:
        holders = {a.agent_id for a in agents if a.agent_id in feasible_ids
                   and (d in a.resident or a.agent_id == pending)}
        if holders:
            # the first choice is a holder unless every holder is over the bound
            total = sum(inflight[i] for i in feasible_ids)
            rtotal = sum(a.reported_load for a in agents if a.agent_id in feasible_ids)
            n = len(feasible_ids)
            busy = {a.agent_id for a in agents if a.agent_id in holders
                    and not within(inflight[a.agent_id], total, n)
                    and not within(a.reported_load, rtotal, n)}
            if holders - busy:
                assert order[0] in holders - busy
