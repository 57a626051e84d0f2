"""Agent-facing bodies: registration, heartbeat reports, desired state."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

AGENT_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?$"
INT32 = 2**31 - 1
"""Upper bound of counters stored in INTEGER columns."""


class Capabilities(BaseModel):
    """What placement and validation need to know about one agent."""

    base: str = Field(pattern=r"^[0-9a-f]{64}$", description="H_base the agent serves.")
    dtypes: list[str] = Field(min_length=1)
    max_rank: int = Field(ge=1)
    targets: list[str] = Field(description="Adapter target roles it can serve (q_proj, ...).")
    adapter_slots: int = Field(ge=1)
    pool_pages: int = Field(ge=1, description="Unified pool size in pages (KV + adapters).")
    page_bytes: int = Field(ge=1)
    kv_reserve_pages: int = Field(ge=0, description="Pages placement must leave for KV.")
    tp_degree: int = Field(default=1, ge=1)


class RegisterRequest(BaseModel):
    name: str = Field(pattern=AGENT_NAME_PATTERN)
    url: str = Field(max_length=500, description="Where the agent's inference API listens.")
    capabilities: Capabilities


class AgentOut(BaseModel):
    id: int
    name: str
    url: str
    base: str
    capabilities: dict[str, Any]
    worker_epoch: int
    registered_at: datetime
    last_heartbeat_at: datetime | None
    catalog_version: int
    slots: list[dict[str, Any]]
    load_failures: list[dict[str, Any]]
    state: str = Field(description="live: heard from (registration or heartbeat) within the "
                       "liveness window placement uses (60 s); stale: not.")


class SlotReport(BaseModel):
    artifact_digest: str
    artifact_id: int | None = None
    state: str
    refcount: int = 0
    slot: int | None = None
    slot_generation: int | None = None
    prefetch: bool = False
    waiting: int = 0
    collection: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """H_collection when the slot serves its artifact from a collection's shared bases."""


class LoadFailureReport(BaseModel):
    artifact: str
    error: str
    stage: str
    at: float


class HeartbeatRequest(BaseModel):
    worker_epoch: int = Field(ge=1, le=INT32)
    catalog_version: int = Field(ge=0, le=INT32)
    live_requests: int = Field(default=0, ge=0, le=INT32)
    slots: list[SlotReport] = Field(default_factory=list, max_length=4096)
    load_failures: list[LoadFailureReport] = Field(default_factory=list, max_length=256)


class HeartbeatOut(BaseModel):
    worker_epoch: int
    catalog_version: int


class AuthorizeOut(BaseModel):
    namespace: str
    role: str
    actor: str
