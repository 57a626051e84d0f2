"""Residency of one adapter generation on one worker: an explicit guarded state machine.

States::

    absent -> host_ready -> reserved -> loading -> validated -> published
           -> active <-> idle -> retiring -> absent

Every pre-publication state may fall back to ``absent`` (rollback). ``published``,
``active`` and ``idle`` have a pointer-table entry; only ``published`` / ``idle`` may
take *new* binds besides ``active``; ``retiring`` takes none. Recovery after
publication is a new :class:`Residency` with a new generation, never a step back.

A record is one ``(key, generation)``: ``key`` is the artifact digest and
``generation`` this worker's residency generation for that key (b@g4 -> b@g5 after a
rollback restored it). Counters are the eviction inputs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dataplane.pool.errors import IllegalTransition
from dataplane.pool.events import CopyEvent


class ResidencyState(enum.Enum):
    ABSENT = "absent"
    HOST_READY = "host_ready"
    RESERVED = "reserved"
    LOADING = "loading"
    VALIDATED = "validated"
    PUBLISHED = "published"
    ACTIVE = "active"
    IDLE = "idle"
    RETIRING = "retiring"


S = ResidencyState
ALLOWED: dict[ResidencyState, frozenset[ResidencyState]] = {
    S.ABSENT: frozenset({S.HOST_READY}),
    S.HOST_READY: frozenset({S.RESERVED, S.ABSENT}),
    S.RESERVED: frozenset({S.LOADING, S.ABSENT}),
    S.LOADING: frozenset({S.VALIDATED, S.ABSENT}),
    S.VALIDATED: frozenset({S.PUBLISHED, S.ABSENT}),
    S.PUBLISHED: frozenset({S.ACTIVE, S.IDLE, S.RETIRING}),
    S.ACTIVE: frozenset({S.IDLE, S.RETIRING}),
    S.IDLE: frozenset({S.ACTIVE, S.RETIRING}),
    S.RETIRING: frozenset({S.ABSENT}),
}
"""The only legal transitions; anything else raises :class:`IllegalTransition`."""

VISIBLE = frozenset({S.PUBLISHED, S.ACTIVE, S.IDLE})
"""States with a pointer-table entry that new requests may bind."""

HAS_PAGES = frozenset({S.RESERVED, S.LOADING, S.VALIDATED, S.PUBLISHED, S.ACTIVE, S.IDLE,
                       S.RETIRING})


@dataclass
class Residency:
    """One adapter generation's residency and its eviction-relevant counters."""

    key: str
    generation: int
    state: ResidencyState = S.ABSENT
    pages: tuple[int, ...] = ()
    slot: int | None = None
    refcount: int = 0
    pin_count: int = 0
    queued_reservations: int = 0
    events: list[CopyEvent] = field(default_factory=list)
    last_touch: int = 0
    host_source_verified: bool = False
    txn: str | None = None
    """Open transaction whose reservation currently holds ``pages`` (else they are owned)."""
    history: list[ResidencyState] = field(default_factory=list)

    def transition(self, to: ResidencyState) -> None:
        """Move to ``to`` or raise :class:`IllegalTransition` (state unchanged)."""
        if to not in ALLOWED[self.state]:
            raise IllegalTransition(f"{self.key}@g{self.generation}: "
                                    f"{self.state.value} -> {to.value}",
                                    key=self.key, generation=self.generation)
        self.history.append(self.state)
        self.state = to

    @property
    def inflight_events(self) -> int:
        """Device copies/launches that may still touch the pages (completed ones pruned)."""
        self.events = [e for e in self.events if not e.query()]
        return len(self.events)

    def note_use(self, event: CopyEvent) -> None:
        """Record an asynchronous reader/writer (a launch's last-use or a copy event)."""
        self.events.append(event)

    def settle_refcount(self) -> None:
        """``active`` while referenced, ``idle`` when not (visible states only)."""
        if self.state is S.PUBLISHED or self.state is S.IDLE:
            if self.refcount > 0:
                self.transition(S.ACTIVE)
            elif self.state is S.PUBLISHED:
                self.transition(S.IDLE)
        elif self.state is S.ACTIVE and self.refcount == 0:
            self.transition(S.IDLE)
