"""Placement policy: hot adapters on every compatible agent, consolidation onto agents
holding the working set, KV feasibility, compatibility. Expected placements worked out
by hand from the policy's rules."""

from __future__ import annotations

from dataclasses import replace

from controlplane.placement.policy import AdapterDemand, AgentCapacity, place, replica_targets

BASE = "0" * 64
ALL = frozenset({"q_proj", "v_proj", "o_proj"})


def agent(i: int, slots: int = 4, pages: int = 100, reserve: int = 60,
          holds: frozenset[str] = frozenset(), base: str = BASE, max_rank: int = 16,
          targets: frozenset[str] = ALL) -> AgentCapacity:
    return AgentCapacity(i, base, max_rank, targets, slots, pages, 1000, reserve, holds)


def adapter(d: str, nbytes: int = 10_000, rank: int = 8,
            roles: frozenset[str] = frozenset({"q_proj"})) -> AdapterDemand:
    return AdapterDemand(d, BASE, rank, roles, nbytes)  # 10 pages at 1000 B/page


def test_held_adapters_stay_and_new_ones_join_the_fuller_agent() -> None:
    placed = place([adapter("x"), adapter("y"), adapter("z")],
                   [agent(1, holds=frozenset({"x"})), agent(2)])
    assert placed == {1: frozenset({"x", "y", "z"}), 2: frozenset()}


def test_kv_reserve_bounds_adapter_pages() -> None:
    # 100 pages, 60 reserved for KV: room for 4 adapters of 10 pages, the 5th spills over
    placed = place([adapter(c) for c in "abcde"], [agent(1, slots=8), agent(2, slots=8)])
    assert len(placed[1]) == 4 and placed[2] == frozenset({"e"})


def test_slots_bound_placement_and_unfit_adapters_stay_unplaced() -> None:
    placed = place([adapter("a"), adapter("b"), adapter("huge", nbytes=50_000)],
                   [agent(1, slots=1)])
    assert placed == {1: frozenset({"a"})}


def test_incompatible_agents_get_nothing() -> None:
    other_base = agent(1, base="1" * 64)
    low_rank = agent(2, max_rank=4)
    few_targets = agent(3, targets=frozenset({"v_proj"}))
    placed = place([adapter("a", rank=8, roles=frozenset({"q_proj"}))],
                   [other_base, low_rank, few_targets])
    assert placed == {1: frozenset(), 2: frozenset(), 3: frozenset()}


def test_deterministic_for_equal_inputs() -> None:
    inputs = ([adapter(c, nbytes=1000 * (i + 1)) for i, c in enumerate("pqrs")],
              [agent(1, slots=2), agent(2, slots=2)])
    assert place(*inputs) == place(*inputs)


def hot(d: str, nbytes: int = 10_000, rank: int = 8,
        roles: frozenset[str] = frozenset({"q_proj"})) -> AdapterDemand:
    return AdapterDemand(d, BASE, rank, roles, nbytes, hot=True)


def test_hot_adapter_goes_to_every_compatible_agent_with_room() -> None:
    # without the mark, "h" would join only one agent (rule 2); hot, it is on all three
    # that fit it. Agent 4 serves another base and gets nothing.
    agents = [agent(1), agent(2), agent(3, holds=frozenset({"x"})), agent(4, base="1" * 64)]
    placed = place([adapter("x"), hot("h")], agents)
    assert placed == {1: frozenset({"h"}), 2: frozenset({"h"}), 3: frozenset({"h", "x"}),
                      4: frozenset()}
    # the same adapter cold joins agent 3 only, which holds the most of the working set
    cold = place([adapter("x"), adapter("h")], agents)
    assert cold == {1: frozenset(), 2: frozenset(), 3: frozenset({"h", "x"}), 4: frozenset()}


def test_hot_is_placed_before_a_heavier_cold_adapter() -> None:
    # one agent, 100 pages, 60 reserved: 40 pages of room. "heavy" (30 pages) would be
    # placed first by weight and leave 10, too few for the 20-page hot "h"; hot goes
    # first (20 pages), and "heavy" no longer fits the 20 left
    placed = place([adapter("heavy", nbytes=30_000), hot("h", nbytes=20_000)], [agent(1)])
    assert placed == {1: frozenset({"h"})}
    cold = place([adapter("heavy", nbytes=30_000), adapter("h", nbytes=20_000)], [agent(1)])
    assert cold == {1: frozenset({"heavy"})}


def test_hot_adapters_are_placed_heaviest_first_then_by_digest() -> None:
    # 40 pages of room: "b" (30 pages) goes first and leaves 10: "a" and "c" (10 pages
    # each) tie on weight, so the smaller digest "a" takes the last room
    placed = place([hot("c"), hot("a"), hot("b", nbytes=30_000)], [agent(1)])
    assert placed == {1: frozenset({"a", "b"})}


def test_hot_respects_slots_kv_reserve_and_compatibility() -> None:
    agents = [
        agent(1, slots=1),  # one slot: the first (heaviest) hot adapter only
        agent(2, reserve=85),  # 15 pages of room: one 10-page adapter, no 20-page one
        agent(3, max_rank=4),  # the rank-8 adapters do not fit its rank
        agent(4, targets=frozenset({"v_proj"})),  # no q_proj
        agent(5),  # room for both
    ]
    placed = place([hot("big", nbytes=20_000), hot("small")], agents)
    assert placed == {1: frozenset({"big"}), 2: frozenset({"small"}), 3: frozenset(),
                      4: frozenset(), 5: frozenset({"big", "small"})}


def test_hot_displaces_a_held_cold_adapter_when_room_is_short() -> None:
    # agent 1 has 40 pages of room and holds "x" (30 pages); agent 2 has 50 (reserve 50)
    agents = [agent(1, holds=frozenset({"x"})), agent(2, reserve=50)]
    demand = [adapter("x", nbytes=30_000), adapter("h", nbytes=20_000)]
    # cold: "x" stays where it is (rule 1, 10 pages left there), "h" (20 pages) only
    # fits agent 2 (rule 2)
    assert place(demand, agents) == {1: frozenset({"x"}), 2: frozenset({"h"})}
    # hot "h" goes to both agents first (rule 0): 20 pages left on agent 1, too few for
    # the held "x", which moves to agent 2 (30 pages left there: exactly fits)
    demand[1] = hot("h", nbytes=20_000)
    assert place(demand, agents) == {1: frozenset({"h"}), 2: frozenset({"h", "x"})}
    # with one slot on agent 2, taken by "h", "x" fits nowhere and is left unplaced
    one_slot = [agent(1, holds=frozenset({"x"})), agent(2, slots=1, reserve=50)]
    assert place(demand, one_slot) == {1: frozenset({"h"}), 2: frozenset({"h"})}


def test_an_artifact_is_hot_if_any_alias_serving_it_is_hot() -> None:
    # the same digest, current for a cold alias and a hot one
    for demand in ([adapter("s"), hot("s")], [hot("s"), adapter("s")]):
        assert place(demand, [agent(1), agent(2)]) == {1: frozenset({"s"}),
                                                       2: frozenset({"s"})}


def test_replica_targets_give_one_copy_per_fleet_average_share() -> None:
    # 4 agents, 20 req/s in all: a fleet-average share is 5 req/s
    got = replica_targets({"hot": 11.0, "warm": 5.0, "cool": 4.0, "idle": 0.0}, 4, 1.0)
    assert got == {"hot": 3, "warm": 1, "cool": 1}  # ceil(11/5) = 3, ceil(5/5) = 1
    assert replica_targets({"all": 9.0}, 3, 1.0) == {"all": 3}  # at most the agent count
    # ... and at most one copy per `min_rps` of the adapter's own rate
    assert replica_targets({"hot": 11.0, "warm": 5.0, "cool": 4.0}, 4, 5.0) == {
        "hot": 3, "warm": 1, "cool": 1}
    assert replica_targets({"hot": 11.0, "warm": 5.0, "cool": 4.0}, 4, 10.0) == {
        "hot": 2, "warm": 1, "cool": 1}
    assert replica_targets({"burst": 2.0}, 3, 4.0) == {"burst": 1}
    assert replica_targets({"x": 0.0}, 3) == {}
    assert replica_targets({"x": 1.0}, 0) == {}


def test_replicas_put_copies_on_distinct_agents_fullest_first() -> None:
    hot = replace(adapter("h"), replicas=2)
    placed = place([hot, adapter("x")], [agent(1, holds=frozenset({"x"})), agent(2), agent(3)])
    # x stays on 1 (held); h's first copy joins the fullest agent (1), the second the
    # next by free pages then id (2); never two copies on one agent
    assert placed == {1: frozenset({"x", "h"}), 2: frozenset({"h"}), 3: frozenset()}


def test_a_falling_replica_count_keeps_only_that_many_held_copies() -> None:
    held = frozenset({"h"})
    agents = [agent(1, holds=held), agent(2, holds=held), agent(3, holds=held)]
    assert place([replace(adapter("h"), replicas=1)], agents) == {
        1: frozenset({"h"}), 2: frozenset(), 3: frozenset()}
    # without an observed rate every held copy stays (no churn)
    assert place([adapter("h")], agents) == {i: held for i in (1, 2, 3)}
