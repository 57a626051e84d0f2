"""The agent freezes its startup heap before serving (agent.daemon.freeze_startup_heap):
what was built before is out of the collector's generations; what serving allocates
afterwards is collected as usual."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from agent.daemon import freeze_startup_heap


@pytest.fixture()
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_startup_objects_leave_the_collectors_generations(unfrozen: None) -> None:
    built = [[i] for i in range(10_000)]  # tracked containers, as startup builds
    before = gc.get_freeze_count()
    freeze_startup_heap()
    assert gc.get_freeze_count() >= before + len(built)
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in built[:100])
    later = [[1], [2]]
    assert all(id(o) in {id(x) for x in gc.get_objects(generation=0)} for o in later)
