"""Readiness predicates (dataplane/engine/readiness.py): the design's five-request snapshot,
the local selection that picks the peer over the hot request, retiring slots under a lease,
and the engine's lease check (a request runs only on the slot generation it leased)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.engine.adapters import AdapterHandle, AdapterRegistry
from dataplane.engine.readiness import (
    AdapterRequest,
    Reason,
    Residency,
    SlotView,
    WorkerContract,
    classify,
    judge,
    select,
)
from dataplane.sequence import Sequence

BASE = "base-llama"
ATTN = {"q_proj": 8, "k_proj": 8, "v_proj": 8, "o_proj": 8}
WORKER = WorkerContract(BASE, frozenset(ATTN), max_rank=16, layouts=frozenset({"paged"}))


def _req(rid: str, digest: str, generation: int, *, lease: int | None = -1,
         rank: int = 8, tenant: str = "", basis: str | None = None) -> AdapterRequest:
    ranks = {m: rank for m in ATTN}
    return AdapterRequest(rid, digest, generation, BASE, ranks, "paged",
                          generation if lease == -1 else lease, tenant, basis)


SNAPSHOT = [
    _req("r_hot", "A", 7, tenant="hot", basis="basis-0"),
    _req("r_cold", "B", 3, tenant="cold"),
    _req("r_peer", "C", 5, tenant="peer", basis="basis-0"),
    _req("r_stale", "A", 6, lease=None, tenant="stale"),
    _req("r_rank", "D", 1, rank=32, tenant="rank"),
]
SLOTS = {
    "A": SlotView(Residency.RESIDENT, published_generation=7, copy_complete=True),
    "C": SlotView(Residency.RESIDENT, published_generation=5, copy_complete=True),
    "D": SlotView(Residency.RESIDENT, published_generation=1, copy_complete=True),
}


def test_five_request_snapshot() -> None:
    verdicts = {v.request.request_id: v for v in classify(SNAPSHOT, WORKER, SLOTS)}
    table = {rid: (v.feasible, v.ready) for rid, v in verdicts.items()}
    assert table == {"r_hot": (True, True), "r_cold": (True, False), "r_peer": (True, True),
                     "r_stale": (False, False), "r_rank": (False, False)}
    assert verdicts["r_cold"].load_eligible  # may start a load, never a model row
    assert verdicts["r_cold"].reason is Reason.NOT_RESIDENT
    assert verdicts["r_stale"].reason is Reason.STALE_GENERATION
    assert verdicts["r_rank"].reason is Reason.RANK_UNSUPPORTED
    assert not any(verdicts[r].load_eligible for r in ("r_hot", "r_peer", "r_stale", "r_rank"))


def test_local_selection_picks_the_peer_and_no_bonus_promotes_an_unready_request() -> None:
    verdicts = classify(SNAPSHOT, WORKER, SLOTS)
    service = {"hot": 3.0, "peer": 1.0}

    def key(r: AdapterRequest) -> tuple[object, ...]:
        return (1, service.get(r.tenant, 0.0), r.request_id)

    assert [r.request_id for r in select(verdicts, key, budget=1)] == ["r_peer"]
    assert [r.request_id for r in select(verdicts, key, budget=5)] == ["r_peer", "r_hot"]

    def bribed(r: AdapterRequest) -> tuple[object, ...]:  # an "affinity bonus" for the rest
        return (-100 if r.request_id in ("r_cold", "r_stale", "r_rank") else 0, r.request_id)

    assert {r.request_id for r in select(verdicts, bribed, budget=5)} == {"r_hot", "r_peer"}


def test_retiring_slot_serves_only_the_requests_that_leased_it() -> None:
    # After a republish: the old generation's slot retires; the request that leased
    # generation 8 keeps running on it, a new request binds generation 9 elsewhere.
    old_slot = SlotView(Residency.RETIRING, 8, True, leases=frozenset({"request-old"}))
    new_slot = SlotView(Residency.RESIDENT, 9, True)
    old = judge(_req("request-old", "A8", 8), WORKER, old_slot)
    late = judge(_req("request-late", "A8", 8), WORKER, old_slot)
    new = judge(_req("request-new", "A9", 9), WORKER, new_slot)
    assert (old.ready, late.ready, new.ready) == (True, False, True)
    assert late.reason is Reason.NOT_RESIDENT
    # asking for the superseded generation without a lease fails feasibility outright
    assert judge(_req("request-x", "A9", 8, lease=9), WORKER, new_slot).reason is \
        Reason.STALE_GENERATION


def test_copy_event_and_published_generation_gate_readiness() -> None:
    req = _req("r", "A", 7)
    copying = SlotView(Residency.RESIDENT, 7, copy_complete=False)
    wrong = SlotView(Residency.RESIDENT, 6, copy_complete=True)
    loading = SlotView(Residency.LOADING)
    assert judge(req, WORKER, copying).reason is Reason.COPY_PENDING
    assert judge(req, WORKER, wrong).reason is Reason.GENERATION_NOT_PUBLISHED
    assert judge(req, WORKER, loading).reason is Reason.NOT_RESIDENT
    assert not judge(req, WORKER, copying).load_eligible  # a copy is already under way
    other_base = replace(req, base_digest="other")
    assert judge(other_base, WORKER, SLOTS["A"]).reason is Reason.BASE_MISMATCH
    mlp = replace(req, ranks={"gate_proj": 8})
    assert judge(mlp, WORKER, SLOTS["A"]).reason is Reason.TARGETS_UNSUPPORTED
    folded = replace(req, layout="folded")
    assert judge(folded, WORKER, SLOTS["A"]).reason is Reason.LAYOUT_UNSUPPORTED
    assert judge(req, WORKER, SLOTS["A"], reserve_possible=False).reason is \
        Reason.NO_RESERVATION


class _Runner:
    max_slots = 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["bind", "release", "lease"]),
                          st.integers(0, 2), st.sampled_from(["x", "y"])), max_size=40))
def test_engine_readiness_follows_the_leased_adapter_across_slot_reuse(
        ops: list[tuple[str, int, str]]) -> None:
    """Random binds, releases and rebinds of slots with two adapters: a request that leased
    adapter x in a slot is ready exactly while a handle of x (any slot generation: the
    same content reloaded) is bound there — never while y reuses the slot."""
    registry = AdapterRegistry(_Runner())  # type: ignore[arg-type]
    leases: list[tuple[Sequence, AdapterHandle]] = []
    for n, (op, slot, digest) in enumerate(ops):
        bound = registry.bound().get(slot)
        if op == "bind" and bound is None:
            registry.bind(AdapterHandle(slot, digest, registry.next_generation(slot), 8, ""))
        elif op == "release" and bound is not None:
            registry.release(bound)
        elif op == "lease" and bound is not None:
            seq = Sequence(f"r{n}", (1,), adapter_slot=slot, adapter_digest=bound.digest)
            leases.append((seq, bound))
        for seq, leased in leases:
            now = registry.bound().get(leased.slot)
            assert registry.is_ready(seq) == (now is not None and now.digest == leased.digest)
