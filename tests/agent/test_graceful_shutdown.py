"""SIGTERM drains the agent within a bounded time.

A slowed agent (a sleep before every engine step) runs a long non-streaming request and
a short one when it gets SIGTERM: the short one completes normally, the long one is
aborted once the shutdown grace is over (it would otherwise run for many seconds), and
the process exits 0 soon after the grace, without a SIGKILL.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Deployment, extra_agent

GRACE_S = 2.0
STEP_DELAY_S = 0.05
LONG_TOKENS = 200
"""At STEP_DELAY_S per step, ten seconds: far past the grace."""


def _post(url: str, token: str, model: str, max_tokens: int, out: dict[str, Any],
          key: str) -> None:
    try:
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       headers={"Authorization": f"Bearer {token}"},
                       json={"model": model, "prompt": [4, 5, 6], "max_tokens": max_tokens,
                             "temperature": 0, "ignore_eos": True})
        out[key] = r.status_code
    except httpx.HTTPError as exc:
        out[key] = type(exc).__name__
    out[f"{key}_at"] = time.monotonic()


def test_sigterm_finishes_short_requests_and_aborts_the_rest_in_time(
        deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> None:
    model = f"{deployment.namespace}/a"
    with extra_agent(deployment, tmp_path_factory, "agent-draining",
                     {"ADAPTERPLANE_AGENT_SHUTDOWN_GRACE_S": str(GRACE_S),
                      "ADAPTERPLANE_AGENT_FAULT_STEP_DELAY_S": str(STEP_DELAY_S)}) as agent:
        assert agent.proc is not None
        out: dict[str, Any] = {}
        calls = [threading.Thread(target=_post, args=(agent.url, deployment.reader_token,
                                                      model, n, out, key))
                 for key, n in (("long", LONG_TOKENS), ("short", 4))]
        calls[0].start()
        agent.wait_for(lambda s: s.get("live", 0) >= 1)
        calls[1].start()
        agent.wait_for(lambda s: s.get("live", 0) >= 2)
        sent = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        code = agent.proc.wait(timeout=GRACE_S + 20)
        exited = time.monotonic()
        for call in calls:
            call.join(timeout=30)
    assert code == 0, agent.tail()
    assert exited - sent < GRACE_S + 10, agent.tail()
    assert out["short"] == 200
    assert out["long"] != 200  # cut off by the grace, not run to its end
    assert out["long_at"] - sent < GRACE_S + 10


def _children(pid: int) -> list[int]:
    """Child processes of `pid` (any of its threads may have started them)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def test_the_agent_exits_non_zero_when_its_http_front_dies(
        deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The front process holds the port; without it nothing reaches the engine, so the
    agent stops (status 1) for its supervisor to restart it, rather than stay registered
    and unreachable."""
    with extra_agent(deployment, tmp_path_factory, "agent-front-killed", {}) as agent:
        assert agent.proc is not None
        r = httpx.get(f"{agent.url}/healthz", timeout=10)
        assert r.status_code == 200
        fronts = _children(agent.proc.pid)
        assert len(fronts) == 1, fronts
        os.kill(fronts[0], signal.SIGKILL)
        code = agent.proc.wait(timeout=30)
    assert code == 1, agent.tail()
