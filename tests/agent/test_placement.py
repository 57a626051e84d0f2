"""Placement policy: consolidation onto agents holding the working set, KV feasibility,
compatibility. Expected placements worked out by hand from the policy's rules."""

from __future__ import annotations

from controlplane.placement.policy import AdapterDemand, AgentCapacity, place

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
