"""bench/fleet_sim.py on a tiny fleet: conservation, determinism, and affinity paying off."""

from __future__ import annotations

from collections import Counter

import pytest

import agent.router.routing
from bench import fleet_sim
from bench.fleet_sim import POLICIES, EngineModel, Scenario, Sim, make_trace

SCENARIO = Scenario(agents=4, adapters=50, zipf=1.2, rate=120.0, warmup_s=0.0,
                    duration_s=4.0, seed=3)
MODEL = EngineModel(slots=12)
SAT_REQ_S = 58.0


def run(policy: str, sc: Scenario = SCENARIO) -> Sim:
    sim = Sim(sc, MODEL, make_trace(sc, sc.rate), policy, sat_req_s=SAT_REQ_S)
    sim.run()
    return sim


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_completes_exactly_once(policy: str) -> None:
    sc = SCENARIO
    sim = Sim(sc, MODEL, make_trace(sc, sc.rate), policy, sat_req_s=SAT_REQ_S)
    completions: Counter[int] = Counter()
    complete = sim.complete

    def counted(ag: fleet_sim.Agent, r: int, now: float) -> None:
        completions[r] += 1
        complete(ag, r, now)

    sim.complete = counted  # type: ignore[method-assign]
    sim.run()
    n = len(sim.tr.arrive)
    assert n > 300
    assert not any(sim.rejected)
    assert sorted(completions) == list(range(n))
    assert set(completions.values()) == {1}
    assert sim.open == 0
    for r in range(n):
        assert sim.tr.arrive[r] < sim.first_t[r] <= sim.done_t[r]
    for ag in sim.agents:
        assert ag.total == ag.n_admitted == ag.n_decoding == ag.loaders_busy == 0
        assert not ag.waitq and not ag.prefillq and not ag.blocked and not ag.batch
        assert len(ag.slots) <= MODEL.slots
    for rt in sim.routers:
        assert all(v == 0 for v in rt.local.inflight.values())
    # every adapter requested was loaded at least once (no slot starts warm here,
    # except the oracle's preplaced ones)
    result = sim.result(5000.0, 0.0)
    assert result.total_completed == result.total_requests == n
    if policy != "oracle":
        assert result.total_loads >= result.total_distinct


def test_deterministic_for_a_seed() -> None:
    a, b = run("product"), run("product")
    assert a.first_t == b.first_t and a.load_log == b.load_log
    other = run("product", Scenario(**{**SCENARIO.__dict__, "seed": 4}))
    assert other.tr.arrive != a.tr.arrive


def test_product_policy_is_the_routers_route(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = agent.router.routing.route

    def spy(*args: object, **kwargs: object) -> list[agent.router.routing.AgentView]:
        calls.append(args[0])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(agent.router.routing, "route", spy)
    sim = run("product")
    assert len(calls) == len(sim.tr.arrive)


def test_affinity_loads_fewer_adapters_than_round_robin() -> None:
    rr, product = run("round-robin"), run("product")
    assert len(product.load_log) <= len(rr.load_log)
    assert len(product.load_log) < 0.7 * len(rr.load_log)
