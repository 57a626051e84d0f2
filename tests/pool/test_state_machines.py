"""Residency and slot transitions, page-pool verbs, fault spec parsing."""

from __future__ import annotations

import pytest

from dataplane.pool.errors import IllegalTransition, PageOwnershipError
from dataplane.pool.faults import FaultAction, FaultInjector, FaultPoint, parse_faults
from dataplane.pool.page_pool import AdapterOwner, KvOwner, PagePool, ReservedBy
from dataplane.pool.residency import ALLOWED, Residency, ResidencyState

S = ResidencyState
HAPPY = [S.HOST_READY, S.RESERVED, S.LOADING, S.VALIDATED, S.PUBLISHED, S.ACTIVE, S.IDLE,
         S.RETIRING, S.ABSENT]


def test_happy_path_and_every_illegal_edge() -> None:
    r = Residency("k", 1)
    for state in HAPPY:
        r.transition(state)
    assert r.state is S.ABSENT and r.history[0] is S.ABSENT
    for src in S:
        for dst in S:
            r = Residency("k", 1, state=src)
            if dst in ALLOWED[src]:
                r.transition(dst)
                assert r.state is dst
            else:
                with pytest.raises(IllegalTransition):
                    r.transition(dst)
                assert r.state is src
    # publication is never skipped, retirement is never undone
    assert S.PUBLISHED not in ALLOWED[S.LOADING] and S.RETIRING not in ALLOWED[S.VALIDATED]
    assert ALLOWED[S.RETIRING] == {S.ABSENT}


def test_page_pool_verbs_lowest_first_and_atomic() -> None:
    pool = PagePool(8)
    assert pool.allocate(KvOwner("r"), 3) == (0, 1, 2)
    pool.release(KvOwner("r"), [1])
    assert pool.allocate(AdapterOwner("a", 1), 2) == (1, 3)
    with pytest.raises(PageOwnershipError):
        pool.reserve("t", 9)
    with pytest.raises(PageOwnershipError):
        pool.reserve("t", 1, [AdapterOwner("zz", 1)])
    with pytest.raises(PageOwnershipError):
        pool.release(KvOwner("r"), [0, 0])
    with pytest.raises(PageOwnershipError):
        pool.release(KvOwner("r"), [0, 3])  # 3 is an adapter page
    assert pool.check().as_dict() == {"free": 4, "reserved": 0, "adapter": 2, "kv": 2}
    got = pool.reserve("t", 2, [AdapterOwner("a", 1)])
    assert got == (1, 3, 4, 5)
    assert pool.pages_of(ReservedBy("t")) == got and pool.pages_of(AdapterOwner("a", 1)) == ()
    with pytest.raises(PageOwnershipError):
        pool.assign("t", [0], KvOwner("x"))
    pool.assign("t", [4, 5], KvOwner("x"))
    pool.release_reservation("t")
    assert pool.check().as_dict() == {"free": 4, "reserved": 0, "adapter": 0, "kv": 4}


def test_fault_spec_parsing_and_injector() -> None:
    specs = parse_faults("copy=fail@2, validate=delay:0.5*3,publish=fail*0")
    assert specs[FaultPoint.COPY].after_pages == 2
    assert specs[FaultPoint.VALIDATE].action is FaultAction.DELAY
    assert (specs[FaultPoint.VALIDATE].delay_s, specs[FaultPoint.VALIDATE].times) == (0.5, 3)
    with pytest.raises(ValueError):
        parse_faults("teleport=fail")
    with pytest.raises(ValueError):
        parse_faults("copy=explode")
    inj = FaultInjector.from_env({"ADAPTERPLANE_FAULTS": "publish=fail*2"})
    assert inj.armed and inj.take(FaultPoint.PUBLISH) and inj.take(FaultPoint.PUBLISH)
    assert inj.take(FaultPoint.PUBLISH) is None
    assert not FaultInjector.from_env({}).armed


def test_bookkeeping_modules_are_torch_free() -> None:
    import subprocess
    import sys

    code = ("import sys\n"
            "import dataplane.pool.page_pool, dataplane.pool.page_demand\n"
            "import dataplane.pool.residency, dataplane.pool.eviction\n"
            "import dataplane.pool.slot_table, dataplane.pool.faults\n"
            "sys.exit(1 if 'torch' in sys.modules else 0)\n")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
