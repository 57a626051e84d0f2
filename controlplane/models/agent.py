"""Agents: one row per agent name, with its current worker epoch and last report.

`worker_epoch` increases by one at every registration (a process start), so reports
from a previous process of the same agent are recognisably stale (409). Capabilities
are what placement needs (base digest, dtypes, max rank, targets, pool size, TP
degree); `slots` and `load_failures` are the agent's last heartbeat report, replaced
wholesale each time (the agent re-derives them; they are observations, not truth), as
is `load` (live and waiting requests, free pages: what routers balance on). `drain` is
an operator's request that routers send the agent no new requests (cleared when a new
process registers); `drained` is the agent's report that, draining, it has nothing left
in flight. `release_id` is the merged release an operator assigned the agent
(`adapterctl agents assign`): the agent serves that checkpoint as its base, from its next
start on (it drains and restarts itself when the assignment changes).
A name is bound to one token (`token_id`), so one agent's credential cannot register
over, heartbeat for or read the desired state of another agent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, ForeignKey, String, false
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.models.base import Base, BigId, CreatedAtMixin, IdMixin, JsonDoc, utcnow
from controlplane.models.merge import Merge


class Agent(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "agents"

    name: Mapped[str] = mapped_column(String(200), nullable=False, unique=True)
    url: Mapped[str] = mapped_column(String(500), nullable=False)
    h_base: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    capabilities: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False)
    worker_epoch: Mapped[int] = mapped_column(nullable=False, default=1)
    registered_at: Mapped[datetime] = mapped_column(nullable=False, default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column()
    slots: Mapped[list[Any]] = mapped_column(JsonDoc, nullable=False, default=list)
    load_failures: Mapped[list[Any]] = mapped_column(JsonDoc, nullable=False, default=list)
    catalog_version: Mapped[int] = mapped_column(nullable=False, default=0)
    """The desired-state version the agent last applied (from its heartbeat)."""
    registered_by: Mapped[str] = mapped_column(String(200), nullable=False)
    token_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("api_tokens.id"))
    """The credential this agent name is bound to: the first token that registered it
    (or the one an admin forced it to). Reports and re-registrations under the name
    from any other token are refused while that token is not revoked."""
    load: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False, default=dict)
    drain: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False,
                                        server_default=false())
    drained: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False,
                                          server_default=false())
    release_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("merges.id"))
    """The merged release (a `merged` merge) this agent is assigned to serve, or None:
    the base it is configured with."""

    release: Mapped[Merge | None] = relationship(lazy="joined")
