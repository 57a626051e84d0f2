"""Which adapter generations occupy the engine's slots, and who holds them.

Owned by the engine-loop thread (no locks). A :class:`Resident` is one artifact
(H_artifact) in one engine slot, with the requests that hold it (`refcount`, taken at
admission and dropped when the request ends) and the requests waiting for its load.
A resident no alias names any more (superseded by a publish, a rollback or a retire)
stays in its slot once no request holds it (`cached`), so rolling back to it, or
publishing it again, is a warm hit. Eviction to make room picks only residents nothing
holds (refcount 0, no waiters): cached ones first, least recently used first; the pool
also evicts them for KV growth.

The engine itself finishes a step before the loop thread runs again, so "last-use event
completed" holds whenever the loop inspects a refcount of 0.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from agent.catalog import ArtifactInfo
from dataplane.engine.adapters import AdapterHandle, LoadedAdapter
from dataplane.engine.native_members import NativeMember


class ResidentState(enum.StrEnum):
    LOADING = "loading"
    """Download/verify in flight, loaded but waiting for a free slot, or waiting out the
    backoff before the next attempt of a failed load."""
    ACTIVE = "active"
    IDLE = "idle"
    RETIRING = "retiring"
    """No alias names it; requests admitted before the switch still hold it."""
    CACHED = "cached"
    """No alias names it and nothing holds it: kept for a warm rollback, the first victim."""


@dataclass
class Resident:
    info: ArtifactInfo
    handle: AdapterHandle | None = None
    loaded: LoadedAdapter | None = None
    """Factors read from disk, kept until a slot takes them."""
    refcount: int = 0
    waiting: list[object] = field(default_factory=list)
    last_use: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)
    prefetch: bool = False
    named: bool = True
    inflight: bool = False
    """A loader thread is working on it."""
    attempts: int = 0
    """Load attempts this resident has started (at most the agent's `load_attempts`)."""
    attempt_id: str | None = None
    """Id of the current or last load attempt, `load-<H_artifact[:12]>-<n>`: a new one for
    every attempt, never reused within the agent process."""
    pages: int = 0
    """Adapter pages its slot holds (set at placement)."""
    retry_at: float | None = None
    """monotonic time the next attempt is due, while one waits out its backoff."""
    _sized: tuple[LoadedAdapter | NativeMember | None, int] = (None, 0)
    """(`loaded` when its factor bytes were counted, that count): status and metrics
    read `factor_bytes` of every resident often, and counting walks every module."""

    @property
    def state(self) -> ResidentState:
        if self.handle is None:
            return ResidentState.LOADING
        if not self.named:
            return ResidentState.RETIRING if self.refcount or self.waiting else (
                ResidentState.CACHED)
        return ResidentState.ACTIVE if self.refcount else ResidentState.IDLE

    @property
    def factor_bytes(self) -> int:
        """Bytes of the LoRA factors this resident places on the device (0 for a member
        served from a collection's tables: see `adapter_collection_resident_bytes`)."""
        loaded = self.loaded
        if loaded is None or isinstance(loaded, NativeMember):
            return 0
        if self._sized[0] is not loaded:
            self._sized = (loaded, sum(m.a.numel() * m.a.element_size()
                                       + m.b.numel() * m.b.element_size()
                                       for m in loaded.modules))
        return self._sized[1]


class ResidentSet:
    """Residents keyed by H_artifact."""

    def __init__(self, max_slots: int) -> None:
        self.max_slots = max_slots
        self.by_digest: dict[str, Resident] = {}

    def get(self, digest: str) -> Resident | None:
        return self.by_digest.get(digest)

    def add(self, info: ArtifactInfo) -> Resident:
        res = Resident(info)
        self.by_digest[info.digest] = res
        return res

    def remove(self, digest: str) -> Resident:
        return self.by_digest.pop(digest)

    def in_slots(self) -> list[Resident]:
        return [r for r in self.by_digest.values() if r.handle is not None]

    @property
    def free_slots(self) -> int:
        return self.max_slots - len(self.in_slots())

    def idle_victim(self, protect: str | None = None) -> Resident | None:
        """The resident to evict for room: nothing holds it; cached (named by no alias)
        before named, placement's prefetch targets last, least recently used first."""
        idle = [r for r in self.in_slots()
                if r.refcount == 0 and not r.waiting and r.info.digest != protect]
        if not idle:
            return None
        return min(idle, key=lambda r: (r.named, r.prefetch and r.named, r.last_use))

    def cached(self) -> list[Resident]:
        """In a slot, named by no alias, held by nobody: evictable at once for room."""
        return [r for r in self.in_slots() if r.state is ResidentState.CACHED]

    def state_counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in ResidentState}
        for r in self.by_digest.values():
            counts[r.state.value] += 1
        return counts
