"""One flush guard for records with immutable request columns, write-once result columns
and a state machine (artifacts, collections): checked on every `before_update`."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import inspect as sa_inspect


def guard_update(target: Any, *, noun: str, immutable: Iterable[str],
                 write_once: Iterable[str], states: type[enum.StrEnum],
                 transitions: Mapping[Any, frozenset[Any]], error: type[Exception]) -> None:
    """Raise `error` when a flush changes an immutable column, overwrites a written
    write-once column, or moves `state` along an edge `transitions` does not allow."""
    state = sa_inspect(target)
    for name in immutable:
        if state.attrs[name].history.has_changes():
            raise error(f"{noun} {target.id}: {name} is immutable")
    for name in write_once:
        history = state.attrs[name].history
        if history.has_changes() and any(old is not None for old in history.deleted):
            raise error(f"{noun} {target.id}: {name} is write-once")
    history = state.attrs["state"].history
    if history.has_changes() and history.deleted:
        old = states(history.deleted[0])
        if states(target.state) not in transitions[old]:
            raise error(f"{noun} {target.id}: {old} -> {target.state} is not allowed")
