"""`adapterctl agents drain|undrain NAME_OR_ID [--wait]` against the real API: an agent
registers and heartbeats over HTTP as the daemon does (here from a thread that plays the
agent: it learns the drain from the heartbeat answer and reports `drained` once its
pretend requests are done), the CLI resolves the name, `--wait` returns once the agent is
drained, and times out with exit 9 `WAIT_TIMEOUT` when it never is."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from typer.testing import Result

from cli.stack import EmbeddedStack

Invoke = Callable[..., Result]


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


class FakeAgent:
    """An agent name registered with its own token, heartbeating from a thread every
    0.1 s; `busy_s` after it hears `drain` it reports `drained` (None: never)."""

    def __init__(self, url: str, token: str, h_base: str, busy_s: float | None) -> None:
        self.name = f"cli-drain-{uuid.uuid4().hex[:8]}"
        self.token = token
        self.busy_s = busy_s
        self.http = httpx.Client(base_url=url, timeout=10,
                                 headers={"Authorization": f"Bearer {token}"})
        caps = {"base": h_base, "dtypes": ["float32"], "max_rank": 8, "targets": ["q_proj"],
                "adapter_slots": 2, "pool_pages": 64, "page_bytes": 8192,
                "kv_reserve_pages": 4}
        reg = self.http.post("/v1/agents/register", json={
            "name": self.name, "url": "http://127.0.0.1:9", "capabilities": caps})
        assert reg.status_code == 201, reg.text
        self.me = reg.json()
        self.heard_drain_at: float | None = None
        self.reported_drained_at: float | None = None
        self._stop = threading.Event()
        self.beat = threading.Event()
        """Set by the first accepted heartbeat."""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            now = time.monotonic()
            drained = (self.heard_drain_at is not None and self.busy_s is not None
                       and now - self.heard_drain_at >= self.busy_s)
            live = 0 if drained else 2
            r = self.http.post(f"/v1/agents/{self.me['id']}/heartbeat", json={
                "worker_epoch": self.me["worker_epoch"], "catalog_version": 0,
                "live_requests": live, "waiting_requests": 1 if live else 0,
                "free_pages": 40, "pool_pages": 64, "drained": drained})
            if r.status_code != 200:
                continue
            self.beat.set()
            if drained and self.reported_drained_at is None:
                self.reported_drained_at = now
            if r.json()["drain"]:
                self.heard_drain_at = self.heard_drain_at or now
            else:
                self.heard_drain_at = self.reported_drained_at = None

    def __enter__(self) -> FakeAgent:
        self._thread.start()
        assert self.beat.wait(10), "the first heartbeat was never accepted"
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.http.close()


@contextmanager
def fake_agent(adapterctl: Invoke, control_plane: EmbeddedStack, h_base: str,
               busy_s: float | None) -> Iterator[FakeAgent]:
    token = ok_json(adapterctl("-o", "json", "tokens", "create", "--name",
                               f"ag-{uuid.uuid4().hex[:6]}", "--agent"))["token"]
    with FakeAgent(control_plane.url, token, h_base, busy_s) as agent:
        yield agent


def test_drain_and_undrain_by_name(adapterctl: Invoke, control_plane: EmbeddedStack,
                                   h_base: str) -> None:
    with fake_agent(adapterctl, control_plane, h_base, busy_s=None) as agent:
        drained = ok_json(adapterctl("-o", "json", "agents", "drain", agent.name))
        assert (drained["id"], drained["drain"], drained["state"]) == (
            agent.me["id"], True, "draining")
        # the list shows the state and the load of the last heartbeat
        table = adapterctl("agents")
        assert table.exit_code == 0, table.output
        row = next(line for line in table.stdout.splitlines() if agent.name in line)
        assert "draining" in row and "2 live, 1 waiting" in row, row
        assert "40/64 free" in table.stdout
        shown = adapterctl("agents", "show", agent.name)
        assert shown.exit_code == 0 and "drain" in shown.stdout

        undrained = ok_json(adapterctl("-o", "json", "agents", "undrain", agent.name))
        assert (undrained["drain"], undrained["drained"], undrained["state"]) == (
            False, False, "live")
        # by id, and with the agent's own token (what a preStop hook holds)
        again = ok_json(adapterctl("-o", "json", "agents", "drain", str(agent.me["id"]),
                                   token=agent.token))
        assert again["drain"] is True
        assert ok_json(adapterctl("-o", "json", "agents", "undrain", agent.name,
                                  token=agent.token))["drain"] is False
        audit = ok_json(adapterctl("-o", "json", "audit", "--limit", "50"))["items"]
        actions = [e["action"] for e in audit if e["target"] == f"agent:{agent.name}"]
        assert actions[:4] == ["agent.undrain", "agent.drain", "agent.undrain", "agent.drain"]

    missing = adapterctl("agents", "drain", "no-such-agent")
    assert missing.exit_code == 3 and "NOT_FOUND" in missing.stderr


def test_drain_wait_returns_once_the_agent_is_drained(adapterctl: Invoke,
                                                      control_plane: EmbeddedStack,
                                                      h_base: str) -> None:
    with fake_agent(adapterctl, control_plane, h_base, busy_s=1.0) as agent:
        started = time.monotonic()
        result = adapterctl("-o", "json", "agents", "drain", agent.name, "--wait",
                            "--timeout", "30")
        returned = time.monotonic()
        out = ok_json(result)
        assert (out["drain"], out["drained"], out["state"]) == (True, True, "drained")
        assert out["load"]["live_requests"] == 0 and out["load"]["waiting_requests"] == 0
        assert agent.reported_drained_at is not None
        assert agent.reported_drained_at - started >= 1.0  # not before the agent said so
        assert returned - agent.reported_drained_at < 5
        assert ok_json(adapterctl("-o", "json", "agents", "undrain", agent.name))[
            "state"] == "live"


def test_drain_wait_times_out_with_exit_9(adapterctl: Invoke, control_plane: EmbeddedStack,
                                          h_base: str) -> None:
    with fake_agent(adapterctl, control_plane, h_base, busy_s=None) as agent:
        started = time.monotonic()
        result = adapterctl("agents", "drain", agent.name, "--wait", "--timeout", "1.5")
        elapsed = time.monotonic() - started
        assert result.exit_code == 9, result.output
        assert "WAIT_TIMEOUT" in result.stderr and "still draining" in result.stderr
        assert "2 live, 1 waiting" in result.stderr
        assert elapsed < 10
        shown = ok_json(adapterctl("-o", "json", "agents", "show", agent.name))
        assert shown["state"] == "draining"  # the drain stays; only the wait gave up
        adapterctl("agents", "undrain", agent.name)


def test_drain_wait_fails_when_undrained_meanwhile(adapterctl: Invoke,
                                                   control_plane: EmbeddedStack,
                                                   h_base: str) -> None:
    admin = httpx.Client(base_url=control_plane.url, timeout=10,
                         headers={"Authorization": f"Bearer {control_plane.token()}"})
    with fake_agent(adapterctl, control_plane, h_base, busy_s=None) as agent, admin:
        def undrain_soon() -> None:
            deadline = time.monotonic() + 10
            while agent.heard_drain_at is None and time.monotonic() < deadline:
                time.sleep(0.05)
            admin.post(f"/v1/agents/{agent.me['id']}/undrain")

        helper = threading.Thread(target=undrain_soon, daemon=True)
        helper.start()
        result = adapterctl("agents", "drain", agent.name, "--wait", "--timeout", "30")
        helper.join(timeout=15)
        assert result.exit_code == 4, result.output
        assert "INVALID_STATE" in result.stderr
