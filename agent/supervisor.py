"""Start and stop an agent as a child process (used by the demo and the tests).

`AgentProcess.start()` runs `python -m agent.daemon` with `ADAPTERPLANE_AGENT_*`
variables, in its own session, output appended to `log_path`, and waits until
`/readyz` answers 200 (registered and first desired state applied). `kill()` is a
crash (SIGKILL, no cleanup); `stop()` is SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class AgentStartError(RuntimeError):
    """The agent exited or never became ready; carries its log tail."""


@dataclass
class AgentProcess:
    """One agent child process listening on `port` (free port by default)."""

    log_path: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    module: ClassVar[str] = "agent.daemon"
    """What `python -m` runs."""
    env_prefix: ClassVar[str] = "ADAPTERPLANE_AGENT_"
    """Of its settings (HOST, PORT and `start`'s overrides are set under it)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, overrides: Mapping[str, str] | None = None,
              timeout_s: float = 120.0) -> None:
        """Start and wait for readiness; `overrides` are settings (`{"max_slots": "4"}`)."""
        prefix = self.env_prefix
        env = {**os.environ, **self.env, f"{prefix}HOST": "127.0.0.1",
               f"{prefix}PORT": str(self.port), "PYTHONUNBUFFERED": "1"}
        env.update({f"{prefix}{k.upper()}": v for k, v in (overrides or {}).items()})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", self.module], env=env,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AgentStartError(f"{self.module} exited {self.proc.returncode}:\n"
                                      f"{self.tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AgentStartError(f"{self.module} not ready after {timeout_s:g}s:\n"
                                      f"{self.tail()}")
            time.sleep(0.2)

    @property
    def headers(self) -> dict[str, str]:
        """The agent's own token, which may read its operator endpoints."""
        token = self.env.get("ADAPTERPLANE_AGENT_TOKEN")
        return {"Authorization": f"Bearer {token}"} if token else {}

    def state(self) -> dict[str, Any]:
        """`GET /v1/agent/state`: epoch, catalog version, slots, live requests."""
        response = httpx.get(f"{self.url}/v1/agent/state", headers=self.headers, timeout=5.0)
        response.raise_for_status()
        return dict(response.json())

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool],
                 timeout_s: float = 30.0) -> dict[str, Any]:
        """Poll the agent state until `predicate` holds (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.state()
            if predicate(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"agent state never matched: {state}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
