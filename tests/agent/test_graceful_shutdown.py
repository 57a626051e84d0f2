"""SIGTERM drains the agent within a bounded time.

A slowed agent (a sleep before every engine step) runs a long non-streaming request and
a short one when it gets SIGTERM: the short one completes normally, the long one is
aborted once the shutdown grace is over (it would otherwise run for many seconds), and
the process exits 0 soon after the grace, without a SIGKILL.
"""

from __future__ import annotations

import signal
import threading
import time
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
