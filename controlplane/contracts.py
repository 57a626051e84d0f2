"""Wire contracts between the control plane and its agents (pydantic v2 models).

Both ends share these models: the control plane's `/v1/agents` routes declare them as
request bodies and `response_model=` (so they are in its OpenAPI document), and the
agent (agent/sync.py, agent/catalog.py, agent/daemon.py) builds its requests from them
and validates every answer into them before reading it by attribute.

* `POST /v1/agents/register`: :class:`RegisterRequest` (with :class:`Capabilities`) ->
  :class:`AgentOut` (also what `GET /v1/agents[/{id}]` lists).
* `POST /v1/agents/{id}/heartbeat`: :class:`HeartbeatRequest` (:class:`SlotReport`,
  :class:`LoadFailureReport`) -> :class:`HeartbeatOut`.
* `GET /v1/agents/{id}/desired-state`: :class:`DesiredState` (:class:`DesiredAlias` ->
  :class:`DesiredGeneration` -> :class:`DesiredArtifact` -> :class:`DesiredFile`,
  :class:`DesiredCollection`; :class:`TenantPolicy`).
* `GET /v1/agents/authorize`: :class:`AuthorizeOut`.

This module imports only pydantic and the standard library, so an agent never pulls in
the control plane's database or app; import-linter keeps it that way (pyproject.toml).
Fields the agent has always tolerated missing keep their defaults (an agent still reads
an older control plane's answer); the response models mark them required in the
OpenAPI document (`json_schema_serialization_defaults_required`), since this control
plane always sends them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

AGENT_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?$"
INT32 = 2**31 - 1
"""Upper bound of counters stored in INTEGER columns."""
HEX64 = r"^[0-9a-f]{64}$"


# ---- registration ---------------------------------------------------------------------


class Capabilities(BaseModel):
    """What placement and validation need to know about one agent."""

    base: str = Field(pattern=HEX64, description="H_base the agent serves.")
    dtypes: list[str] = Field(min_length=1)
    max_rank: int = Field(ge=1)
    targets: list[str] = Field(description="Adapter target roles it can serve (q_proj, ...).")
    adapter_slots: int = Field(ge=1)
    pool_pages: int = Field(ge=1, description="Unified pool size in pages (KV + adapters).")
    page_bytes: int = Field(ge=1)
    kv_reserve_pages: int = Field(ge=0, description="Pages placement must leave for KV.")
    tp_degree: int = Field(default=1, ge=1)
    served_model_name: str | None = Field(
        default=None, max_length=200,
        description="The name requests use for the bare base model on this agent.")


class RegisterRequest(BaseModel):
    """Body of `POST /v1/agents/register` (one per agent process start)."""

    name: str = Field(pattern=AGENT_NAME_PATTERN)
    url: str = Field(max_length=500, description="Where the agent's inference API listens.")
    capabilities: Capabilities


class SlotReport(BaseModel):
    """One resident (or loading/retiring) adapter in an agent's heartbeat."""

    artifact_digest: str
    artifact_id: int | None = None
    state: str
    refcount: int = 0
    slot: int | None = None
    slot_generation: int | None = None
    prefetch: bool = False
    waiting: int = 0
    collection: str | None = Field(default=None, pattern=HEX64)
    """H_collection when the slot serves its artifact from a collection's shared bases."""
    rate: float = Field(default=0.0, ge=0, le=1e9)
    """Requests/s admitted for this adapter since the agent's previous heartbeat
    (placement gives an adapter drawing more than the fleet-average share more replicas)."""


class LoadFailureReport(BaseModel):
    """A recent failed adapter load (download, copy, validate, publish, admission, engine)."""

    artifact: str
    error: str
    stage: str
    at: float


class AgentLoad(BaseModel):
    """How busy an agent is, from its last heartbeat (what routers balance on)."""

    live_requests: int = Field(default=0, ge=0, le=INT32,
                               description="Requests admitted to the engine, running or queued.")
    waiting_requests: int = Field(default=0, ge=0, le=INT32,
                                  description="Requests waiting for a cold adapter load.")
    free_pages: int = Field(default=0, ge=0, le=INT32,
                            description="Unified-pool pages free for KV.")
    pool_pages: int = Field(default=0, ge=0, le=INT32)


class AgentRelease(BaseModel):
    """The merged release an agent is assigned to serve as its base."""

    id: int = Field(description="The merge id.")
    namespace: str
    name: str
    digest: str = Field(description="H_merged.")
    base: str = Field(description="H_base of the merged checkpoint the agent serves.")


class AgentOut(BaseModel):
    """A registered agent: the answer to registration, and what `GET /v1/agents` lists."""

    id: int
    name: str
    url: str
    base: str
    capabilities: Capabilities
    worker_epoch: int = Field(description="Bumped by every registration; reports carrying "
                              "an older epoch are refused (409 STALE_EPOCH).")
    registered_at: datetime
    last_heartbeat_at: datetime | None
    catalog_version: int
    slots: list[SlotReport]
    load_failures: list[LoadFailureReport]
    load: AgentLoad = Field(default_factory=AgentLoad,
                            description="The agent's last reported load.")
    drain: bool = Field(default=False, description="An operator asked the agent to drain: "
                        "routers send it no new requests.")
    drained: bool = Field(default=False, description="Draining and nothing left in flight "
                          "(the agent's last heartbeat said so).")
    state: str = Field(description="live: heard from (registration or heartbeat) within the "
                       "liveness window placement uses (60 s); draining: live, asked to "
                       "drain, requests still in flight; drained: live, drained, idle; "
                       "stale: not heard from within the window.")
    release: AgentRelease | None = Field(
        default=None, description="The merged release an operator assigned this agent "
        "(`adapterctl agents assign`); it serves that checkpoint once `base` equals "
        "`release.base`. Null: the base the agent is configured with.")


# ---- heartbeat --------------------------------------------------------------------------


class HeartbeatRequest(BaseModel):
    """Body of `POST /v1/agents/{id}/heartbeat`: replaces the agent's slot report."""

    worker_epoch: int = Field(ge=1, le=INT32)
    catalog_version: int = Field(ge=0, le=INT32)
    live_requests: int = Field(default=0, ge=0, le=INT32)
    waiting_requests: int = Field(default=0, ge=0, le=INT32)
    free_pages: int = Field(default=0, ge=0, le=INT32)
    pool_pages: int = Field(default=0, ge=0, le=INT32)
    drained: bool = Field(default=False, description="The agent was told to drain and has "
                          "nothing left in flight.")
    slots: list[SlotReport] = Field(default_factory=list, max_length=4096)
    load_failures: list[LoadFailureReport] = Field(default_factory=list, max_length=256)


class HeartbeatOut(BaseModel):
    worker_epoch: int
    catalog_version: int
    drain: bool = Field(default=False, description="An operator asked this agent to drain.")
    release_base: str | None = Field(
        default=None, description="H_base of the merged release this agent is assigned to "
        "serve; null: the base it is configured with. An agent serving another base drains "
        "and restarts onto this one.")


class AuthorizeOut(BaseModel):
    """`GET /v1/agents/authorize`: the client token's role in the namespace."""

    namespace: str
    role: str
    actor: str


# ---- desired state ----------------------------------------------------------------------


class DesiredFile(BaseModel):
    """One file to download: its SHA-256, size and a file:// or presigned http(s) URL."""

    sha256: str
    size: int
    url: str


class DesiredCollection(BaseModel):
    """The fitted Compress-then-Serve collection an artifact materialises a member of."""

    id: int
    digest: str | None = Field(description="H_collection.")
    member: int = Field(description="The member's position in the collection.")
    files: dict[str, DesiredFile] = Field(description="The bundle's files by name.")


class DesiredArtifact(BaseModel):
    """A validated artifact a generation publishes: what to fetch and how to check it."""

    id: int
    digest: str | None = Field(description="H_artifact (set for every validated artifact).")
    files: dict[str, DesiredFile]
    validated_record: dict[str, Any] | None = Field(
        description="The validation record the agent re-derives `digest` from.")
    collection: DesiredCollection | None = Field(
        default=None, exclude_if=lambda value: value is None,
        description="Present (never null) when the artifact is a collection member whose "
                    "collection has a bundle.")


class BaseCheckpoint(BaseModel):
    """`GET /v1/bases/{h_base}/checkpoint`: where an agent downloads a merged base's
    checkpoint (every file with its SHA-256, size and a file:// or presigned URL)."""

    h_base: str
    merge_id: int = Field(description="The (oldest visible) release that produced the base.")
    h_merged: str
    files: dict[str, DesiredFile]
    url_ttl_s: int


class DesiredRelease(BaseModel):
    """A merged release a generation serves: only an agent whose base is `base` serves it,
    with no adapter."""

    id: int = Field(description="The merge id.")
    digest: str = Field(description="H_merged.")
    base: str = Field(description="H_base of the merged checkpoint.")


class DesiredGeneration(BaseModel):
    generation: int
    action: str = Field(description="publish, retire or rollback.")
    artifact: DesiredArtifact | None = Field(description="None for a release or a retire.")
    release: DesiredRelease | None = Field(
        default=None, exclude_if=lambda value: value is None,
        description="Present (never null) when the generation serves a merged release.")


class DesiredAlias(BaseModel):
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    namespace: str
    alias: str
    base: str = Field(default="", description="H_base of the alias: its artifacts are "
                      "adapters of this base (an agent of another base, one serving a "
                      "merged release, refuses them).")
    current_generation: int
    generations: list[DesiredGeneration] = Field(
        description="The alias's most recent generations, newest first (at most 8).")
    prefetch: bool = Field(default=False, description="Placement assigns the current "
                           "generation's artifact to this agent: keep it resident.")
    hot: bool = Field(default=False, description="An admin marked the alias hot: placement "
                      "puts its current artifact on every compatible agent with room.")


class TenantPolicy(BaseModel):
    """One namespace's scheduling policy in the agent's engine, where the namespace of the
    alias a request names is the request's tenant: among ready waiting requests the engine
    admits the most urgent `priority` class first (high < normal < low), then the tenant
    with the least completed weighted service per unit of `weight`."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    namespace: str
    weight: float = Field(default=1.0, description="0 < weight <= 1000 (the control plane "
                          "checks it; the engine refuses anything else and keeps its policy).")
    priority: Literal["high", "normal", "low"] = "normal"


class DesiredState(BaseModel):
    """`GET /v1/agents/{id}/desired-state`: what the agent should serve and keep resident.

    Full (`full`, every alias of the agent's base) or, with `since=V`, incremental (only
    aliases with a generation newer than catalog version `V`); `prefetch` is always the
    complete list of digests placement assigns to this agent, and `tenants` the complete
    list of namespaces' scheduling policies.
    """

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    version: int = Field(description="Catalog change counter the state is complete at.")
    agent_id: int
    worker_epoch: int
    full: bool = Field(default=True, description="Every alias (true) or the changed ones.")
    since: int | None = Field(default=None,
                              description="The `since` asked for (null: a full state).")
    url_ttl_s: int = Field(default=3600, description="Lifetime of the presigned URLs: ask "
                           "for a full state again before they expire.")
    prefetch: list[str] = Field(default_factory=list,
                                description="Digests placement assigns to this agent.")
    tenants_version: int = Field(default=0, description="Tenant-policy change counter "
                                 "`tenants` is complete at (it also counts alias hot-mark "
                                 "changes): long-poll with `tenants_after` to wake on a "
                                 "weight, priority or hot-mark change too.")
    tenants: list[TenantPolicy] = Field(default_factory=list, description="Every "
                                        "namespace's scheduling policy (by name).")
    aliases: list[DesiredAlias]


# ---- fleet routing ----------------------------------------------------------------------


class RouteAlias(BaseModel):
    """An alias's current generation, as a router resolves it at admission."""

    namespace: str
    alias: str
    current_generation: int
    digest: str | None = Field(description="H_artifact of the current generation; None when "
                               "it serves a merged release or the alias is retired (requests "
                               "for it are 410).")
    base: str = Field(description="H_base the alias's adapters are trained on.")
    release: DesiredRelease | None = Field(
        default=None, description="The merged release the current generation serves: "
                                  "requests go to agents of `release.base`, with no adapter.")
    rank: int = Field(default=0, description="The adapter's largest module rank.")
    roles: list[str] = Field(default_factory=list, description="Target roles it adapts.")
    nbytes: int = Field(default=0, description="The adapter's tensor bytes.")
    hot: bool = False


class RouteAgent(BaseModel):
    """An agent as routers see it: where it is, what it can serve, what it holds, how busy
    it is and whether it takes new requests."""

    id: int
    name: str
    url: str
    base: str
    served_model_name: str | None = None
    max_rank: int
    targets: list[str]
    worker_epoch: int
    heartbeat_age_s: float = Field(description="Seconds since its last heartbeat (or "
                                   "registration).")
    drain: bool
    drained: bool
    resident: list[str] = Field(description="Artifact digests in its pool (active, idle, "
                                "retiring or cached) at its last heartbeat.")
    arriving: list[str] = Field(default_factory=list, description="Artifact digests on "
                                "their way there: loading at its last heartbeat, or assigned "
                                "to it by placement now and not resident yet.")
    load: AgentLoad


class RoutingState(BaseModel):
    """`GET /v1/fleet/routing`: what a router needs to admit and route requests.

    `aliases` is None when the caller's `since` equals `version` (nothing in the catalog
    changed; keep the replica); otherwise every alias. `agents` is always complete.
    """

    version: int = Field(description="The catalog change counter the aliases are complete at.")
    lease_s: float = Field(description="An agent whose heartbeat is older than this is not "
                           "routed to.")
    aliases: list[RouteAlias] | None
    agents: list[RouteAgent]
