"""The engine thread runs what it is given on one OS thread, in order: the daemon builds
the engine with `call` and the loop then runs there with `submit`."""

from __future__ import annotations

import threading

import pytest

from agent.engine_thread import EngineThread


def test_every_job_runs_on_one_thread_in_order_and_errors_reach_the_caller() -> None:
    worker = EngineThread()
    try:
        built_on = worker.call(threading.get_ident)
        assert built_on != threading.get_ident()
        order: list[int] = []
        jobs = [worker.submit(lambda i=i: (order.append(i), threading.get_ident())[1])
                for i in range(5)]
        assert {job.result(timeout=10) for job in jobs} == {built_on}
        assert order == list(range(5))

        def fails() -> None:
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            worker.call(fails)
        assert worker.call(threading.get_ident) == built_on  # still serving after an error
    finally:
        worker.shutdown()
