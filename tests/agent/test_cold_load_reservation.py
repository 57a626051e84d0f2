"""The engine loop's age-triggered load reservation, in-process (the agent's own
`EngineLoop`, catalog, fetcher and engine on a tiny random Llama; no HTTP): a long request
holds nearly the whole pool, a cold adapter's load finds no room, and once its request has
waited `cold_reserve_after_s` the pages its load needs are held back from new admissions —
a short request that would fit beside the long one waits until the load is placed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.artifacts import ArtifactFetcher
from agent.catalog import AgentCatalog, ModelRef, parse_desired_state
from agent.config import AgentSettings
from agent.engine_factory import agent_engine
from agent.metrics import AgentMetrics
from agent.serving import EngineLoop
from agent.tickets import Event, Ticket
from dataplane.artifacts import read_base_abi
from dataplane.core import SamplingParams
from dataplane.engine.engine import RequestOutput

from .conftest import AGENT_MAX_RANK, AgentAssets
from .test_catalog_and_artifacts import wire_artifact

BLOCK = 4


class Sink:
    """Collects a ticket's events and the time of its first output."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.first: float | None = None
        self.done = threading.Event()

    def __call__(self, event: Event) -> None:
        if self.first is None and isinstance(event, RequestOutput):
            self.first = time.monotonic()
        self.events.append(event)
        if not isinstance(event, RequestOutput) or event.finished:
            self.done.set()


def _wait(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_cold_load_that_waited_holds_pages_back_from_new_admissions(
        agent_assets: AgentAssets, tmp_path: Path) -> None:
    settings = AgentSettings(model_dir=agent_assets.base, max_slots=2, max_rank=AGENT_MAX_RANK,
                             num_kv_blocks=20, block_size=BLOCK, max_num_seqs=4,
                             max_num_batched_tokens=64, cache_dir=tmp_path)
    metrics = AgentMetrics()
    engine, _ = agent_engine(settings, metrics)
    art = wire_artifact(agent_assets.adapters["d"], agent_assets.base)
    catalog = AgentCatalog()
    catalog.update(*parse_desired_state({"version": 1, "agent_id": 1, "worker_epoch": 1,
                                         "aliases": [{"namespace": "ns", "alias": "cold",
                                                      "current_generation": 1,
                                                      "generations": [{
                                                          "generation": 1,
                                                          "action": "publish",
                                                          "artifact": art}]}]}))
    fetcher = ArtifactFetcher(tmp_path / "cache", read_base_abi(agent_assets.base),
                              max_rank=AGENT_MAX_RANK)
    loop = EngineLoop(engine, fetcher, catalog, metrics, max_slots=2, max_live=64,
                      step_delay_s=0.3, load_attempts=1, cold_reserve_after_s=0.1)
    loop.start()
    try:
        long, cold, short = Sink(), Sink(), Sink()
        total = engine.block_manager.num_free_blocks
        prompt = [(7 * i) % 200 + 3 for i in range(BLOCK * (total - 3) - 1)]  # all but 3
        loop.submit(Ticket("long", prompt, SamplingParams(max_tokens=12, ignore_eos=True),
                           None, long))  # 12 steps of 0.3 s: it runs while the test acts
        _wait(lambda: long.first is not None or bool(long.events))
        assert long.first is not None, long.events
        gen = catalog.resolve(ModelRef("ns", "cold"))
        loop.submit(Ticket("cold", [21, 22, 23], SamplingParams(max_tokens=3, ignore_eos=True),
                           gen, cold))
        # downloaded, refused for room, waited: its pages are held back from admission
        _wait(lambda: engine.scheduler.load_reservation > 0)
        held = engine.scheduler.load_reservation
        assert engine.block_manager.num_free_blocks < held  # the load does not fit yet
        assert cold.first is None
        loop.submit(Ticket("short", [5, 6], SamplingParams(max_tokens=2, ignore_eos=True),
                           None, short))
        time.sleep(0.5)  # many steps: without the hold it would be admitted in the first
        assert short.first is None, "admitted onto the pages held for the cold load"
        assert engine.block_manager.num_free_blocks >= 1  # it would have fit
        released = time.monotonic()
        loop.abort("long")
        assert cold.done.wait(30) and short.done.wait(30)
        assert all(isinstance(e, RequestOutput) for e in cold.events + short.events)
        assert cold.first is not None and short.first is not None
        assert short.first > released  # held back until the load could go in
        _wait(lambda: engine.scheduler.load_reservation == 0)
        lookups = loop.events.lookups
        assert lookups[next(k for k in lookups if k.value == "cold_miss")] == 1
    finally:
        loop.stop()
