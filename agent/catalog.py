"""The agent's view of the catalog: `namespace/alias` generations from desired state.

The control plane is the source of truth; this is a read-only replica refreshed from
`GET /v1/agents/{id}/desired-state` (a `controlplane.contracts.DesiredState`; see
controlplane/agents). Each alias keeps its
recent generations so a request may pin one (`namespace/alias@generation`). A pin to a
generation the replica lacks (older than the desired state's history, or newer than the
replica) is fetched from the control plane by the server and remembered here
(:meth:`AgentCatalog.remember`, a small LRU whose entries expire before their download
URLs do): generations are immutable, so a remembered one never goes stale in meaning.

Resolution (`resolve`) happens once, at admission: it returns one immutable
:class:`Generation` that the request keeps to the end, whatever is published later
(docs/ARCHITECTURE.md, "The unified pool", the launch fence). Typed errors carry the HTTP
status the server maps them to; nothing here ever falls back to the base model or to
another generation.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import ValidationError

from controlplane.contracts import (
    DesiredAlias,
    DesiredArtifact,
    DesiredCollection,
    DesiredState,
)
from dataplane.artifacts import ArtifactRejected, ValidatedArtifact


class ServingError(Exception):
    """A request the agent refuses; `status` and `code` are the HTTP answer."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "INTERNAL_ERROR"

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class BadModelName(ServingError):
    status, code = 422, "VALIDATION_ERROR"


class UnknownAlias(ServingError):
    status, code = 404, "NOT_FOUND"


class AliasRetired(ServingError):
    status, code = 410, "ALIAS_RETIRED"


class Unsupported(ServingError):
    """The artifact needs a rank or a target module this agent cannot serve."""

    status, code = 422, "UNSUPPORTED_ADAPTER"


class Overloaded(ServingError):
    status, code = 429, "OVERLOADED"


class QueueTimeout(ServingError):
    """The request did not start within its `max_queue_ms` (nothing was generated)."""

    status, code = 503, "QUEUE_TIMEOUT"


class Forbidden(ServingError):
    status, code = 403, "FORBIDDEN"


class Unauthenticated(ServingError):
    status, code = 401, "UNAUTHENTICATED"


class WrongBase(ServingError):
    """The generation is served by agents of another base model (a merged release's, or
    the alias's adapters' base): this agent never answers it with its own weights."""

    status, code = 421, "WRONG_BASE"


class LoadFailed(ServingError):
    """Download, digest check or engine load of the adapter failed (nothing was served)."""

    status, code = 503, "ADAPTER_LOAD_FAILED"


_MODEL = re.compile(r"^([a-z0-9-]{1,63})/([A-Za-z0-9._-]{1,200}?)(?:@([0-9]{1,12}))?$")


@dataclass(frozen=True)
class ModelRef:
    """A parsed `model` field: `namespace/alias[@generation]`."""

    namespace: str
    alias: str
    generation: int | None = None

    @classmethod
    def parse(cls, model: str, base_names: Iterable[str] = ()) -> ModelRef:
        """`model` as an alias reference; a 422 that names the valid forms and
        `base_names` (the names of the base models served) when it is none."""
        match = _MODEL.match(model)
        if match is None:
            bases = sorted(base_names)
            served = ", ".join(repr(name) for name in bases) or "none"
            raise BadModelName(
                f"model {model!r} is not served: valid names are a base model ({served}), "
                "'namespace/alias' or 'namespace/alias@generation' (GET /v1/models lists "
                "the aliases you may read)", param="model", model=model, base_models=bases)
        gen = match.group(3)
        return cls(match.group(1), match.group(2), int(gen) if gen is not None else None)


@dataclass(frozen=True)
class CollectionLink:
    """The fitted collection an artifact materialises a member of (desired state's
    `artifact.collection`): H_collection, the member's position and the bundle's files."""

    digest: str
    member: int
    files: Mapping[str, Mapping[str, Any]]

    @classmethod
    def from_wire(cls, doc: DesiredCollection | Mapping[str, Any] | None
                  ) -> CollectionLink | None:
        if doc is not None and not isinstance(doc, DesiredCollection):
            try:
                doc = DesiredCollection.model_validate(doc) if doc else None
            except ValidationError:
                doc = None
        if doc is None or doc.digest is None:
            return None  # no (usable) link: the artifact is served as a plain LoRA
        return cls(doc.digest, doc.member,
                   {name: f.model_dump() for name, f in doc.files.items()})


@dataclass(frozen=True)
class ArtifactInfo:
    """What the agent needs to fetch and check one validated artifact."""

    id: int
    digest: str
    """H_artifact (64 hex), re-derived from `validated_record` on construction."""
    files: Mapping[str, Mapping[str, Any]]
    """`{name: {"sha256", "size", "url"}}`; `url` is file:// or http(s) (presigned)."""
    max_rank: int
    roles: frozenset[str]
    total_bytes: int
    collection: CollectionLink | None = None
    """Set when the artifact is a Compress-then-Serve member (served natively by agents
    with collection blocks, after checking its factors against the bundle)."""
    invocation_tokens: tuple[int, ...] | None = None
    """An activated LoRA's invocation token ids (from its validated record)."""

    @classmethod
    def from_wire(cls, doc: DesiredArtifact | Mapping[str, Any]) -> ArtifactInfo:
        """From desired state's artifact (a mapping is validated into the model first)."""
        art = doc if isinstance(doc, DesiredArtifact) else DesiredArtifact.model_validate(doc)
        try:
            validated = ValidatedArtifact.from_record(art.validated_record or {})
        except ArtifactRejected as exc:
            raise LoadFailed(f"artifact {art.id}: {exc}") from exc
        if validated.h_artifact != art.digest:
            raise LoadFailed(f"artifact {art.id}: record digest differs", digest=art.digest)
        return cls(id=art.id, digest=validated.h_artifact,
                   files={name: f.model_dump() for name, f in art.files.items()},
                   max_rank=validated.max_rank,
                   roles=frozenset(m.role for m in validated.modules),
                   total_bytes=int(validated.total_bytes),
                   collection=CollectionLink.from_wire(art.collection),
                   invocation_tokens=validated.invocation_tokens)


@dataclass(frozen=True)
class ReleaseInfo:
    """The merged release a generation serves: the base model `base` alone, no adapter."""

    id: int
    digest: str
    """H_merged."""
    base: str
    """H_base of the merged checkpoint: only an agent of this base serves the generation."""


@dataclass(frozen=True)
class Generation:
    """One alias generation: an adapter (`artifact`), a merged release (`release`), or a
    retire (neither)."""

    namespace: str
    alias: str
    generation: int
    action: str
    artifact: ArtifactInfo | None
    error: str | None = None
    """Why this generation cannot be served (its record did not check out)."""
    release: ReleaseInfo | None = None
    alias_base: str = ""
    """H_base of the alias: its artifacts are adapters of this base."""

    @property
    def serving_base(self) -> str:
        """The base model an agent must serve to serve this generation."""
        return self.release.base if self.release is not None else self.alias_base

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.alias}"


@dataclass
class AliasState:
    current: int
    generations: dict[int, Generation] = field(default_factory=dict)
    prefetch: bool = False


PINNED_LIMIT = 256
"""Fetched pinned generations remembered (LRU)."""
PINNED_TTL_S = 60.0
"""How long a fetched generation is used before it is fetched again (its download URLs
live longer than this)."""


class AgentCatalog:
    """Thread-safe replica: replaced wholesale by :meth:`update` (a full desired state)
    or patched by :meth:`merge` (an incremental one: changed aliases only)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aliases: dict[str, AliasState] = {}
        self._pinned: OrderedDict[tuple[str, int], tuple[float, Generation]] = OrderedDict()
        self.version = 0

    def remember(self, gen: Generation) -> None:
        """Keep a generation fetched for a pin (see module docstring)."""
        with self._lock:
            key = (gen.name, gen.generation)
            self._pinned[key] = (time.monotonic() + PINNED_TTL_S, gen)
            self._pinned.move_to_end(key)
            while len(self._pinned) > PINNED_LIMIT:
                self._pinned.popitem(last=False)

    def _remembered(self, name: str, generation: int) -> Generation | None:
        with self._lock:
            hit = self._pinned.get((name, generation))
            if hit is None:
                return None
            if hit[0] < time.monotonic():
                del self._pinned[(name, generation)]
                return None
            self._pinned.move_to_end((name, generation))
            return hit[1]

    def update(self, version: int, aliases: Iterable[AliasState]) -> None:
        fresh = {s.generations[s.current].name: s for s in aliases}
        with self._lock:
            self._aliases = fresh
            self.version = version

    def merge(self, version: int, changed: Iterable[AliasState],
              prefetch: set[str]) -> None:
        """Apply an incremental desired state: replace the `changed` aliases, keep the
        rest, and set every alias's `prefetch` from placement's complete digest list."""
        fresh = {s.generations[s.current].name: s for s in changed}
        with self._lock:
            merged = {**self._aliases, **fresh}
            for state in merged.values():
                art = state.generations[state.current].artifact
                state.prefetch = art is not None and art.digest in prefetch
            self._aliases = merged
            self.version = version

    def resolve(self, ref: ModelRef) -> Generation:
        """The generation a new request binds (404 unknown, 410 retired)."""
        key = f"{ref.namespace}/{ref.alias}"
        with self._lock:
            state = self._aliases.get(key)
        gen = None
        if ref.generation is not None:
            gen = (state.generations.get(ref.generation) if state is not None else None) or (
                self._remembered(key, ref.generation))
            if gen is None:
                raise UnknownAlias(f"{key} has no generation {ref.generation} on this agent",
                                   model=key, generation=ref.generation)
        elif state is None:
            raise UnknownAlias(f"model {key!r} is not published", model=key)
        else:
            gen = state.generations[state.current]
        if gen.error is not None:
            raise LoadFailed(gen.error, model=key, generation=gen.generation)
        if gen.artifact is None and gen.release is None:
            raise AliasRetired(f"{key} is retired at generation {gen.generation}",
                               model=key, generation=gen.generation)
        return gen

    def current(self) -> list[Generation]:
        with self._lock:
            return [s.generations[s.current] for s in self._aliases.values()]

    def prefetch_targets(self) -> list[ArtifactInfo]:
        """Artifacts placement asked this agent to keep resident."""
        with self._lock:
            states = list(self._aliases.values())
        return [g.artifact for s in states if s.prefetch
                for g in (s.generations[s.current],) if g.artifact is not None]

    def digests_of(self, name: str) -> set[str]:
        """Artifacts of every generation this replica knows of alias `name` (ns/alias)."""
        with self._lock:
            state = self._aliases.get(name)
        if state is None:
            return set()
        return {g.artifact.digest for g in state.generations.values() if g.artifact is not None}

    def named_digests(self) -> set[str]:
        """Artifacts some alias currently serves (the rest may be reclaimed when idle)."""
        return {g.artifact.digest for g in self.current() if g.artifact is not None}


def parse_desired_state(doc: DesiredState | Mapping[str, Any]
                        ) -> tuple[int, list[AliasState]]:
    """The control plane's desired state -> (version, alias states); a mapping (the wire
    JSON) is validated into :class:`DesiredState` first.

    An artifact whose record does not re-derive its digest makes that generation
    unservable (it raises at load time), never silently another one.
    """
    state = doc if isinstance(doc, DesiredState) else DesiredState.model_validate(doc)
    states = []
    for item in state.aliases:
        gens = parse_generations(item)
        if item.current_generation in gens:
            states.append(AliasState(item.current_generation, gens, item.prefetch))
    return state.version, states


def parse_generations(item: DesiredAlias) -> dict[int, Generation]:
    """An alias's generations on the wire -> generation number -> :class:`Generation`."""
    gens: dict[int, Generation] = {}
    for g in item.generations:
        info, error = None, None
        if g.artifact is not None:
            try:
                info = ArtifactInfo.from_wire(g.artifact)
            except LoadFailed as exc:
                error = exc.message
        release = (None if g.release is None
                   else ReleaseInfo(g.release.id, g.release.digest, g.release.base))
        gens[g.generation] = Generation(item.namespace, item.alias, g.generation,
                                        g.action, info, error, release, item.base)
    return gens


def tenant_policy(doc: DesiredState) -> dict[str, tuple[float, str]]:
    """Desired state's `tenants` -> namespace -> (weight, priority class name): what the
    engine loop applies (`EngineLoop.set_tenant_policy`)."""
    return {t.namespace: (t.weight, t.priority) for t in doc.tenants}
