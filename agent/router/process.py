"""Start and stop a router as a child process (the fleet tests and benchmarks).

`RouterProcess.start()` runs `python -m agent.router.server` with `ADAPTERPLANE_ROUTER_*`
variables, output appended to `log_path`, and waits until `/readyz` answers 200 (its
first routing state applied); `stop()` is SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

from typing import ClassVar

from agent.supervisor import AgentProcess


class RouterProcess(AgentProcess):
    """One router child process listening on `port` (free port by default)."""

    module: ClassVar[str] = "agent.router.server"
    env_prefix: ClassVar[str] = "ADAPTERPLANE_ROUTER_"
