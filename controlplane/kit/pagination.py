"""Keyset pagination: read `limit + 1` rows past an opaque cursor.

A cursor is base64url(JSON `{"k": <last key>}`); clients must treat it as opaque.
Pages are ordered by one unique, immutable integer key (id or generation), so
inserts between page reads never duplicate or skip rows already ordered before them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query
from pydantic import BaseModel
from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute, Session

from controlplane.errors import BadRequest

T = TypeVar("T")
Item = TypeVar("Item")

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


def encode_cursor(key: int) -> str:
    raw = json.dumps({"k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()))["k"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadRequest("invalid cursor", detail={"cursor": cursor}) from exc
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest("invalid cursor", detail={"cursor": cursor})
    return value


@dataclass(frozen=True)
class PageParams:
    limit: int
    cursor: str | None


def page_params(
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(description="Opaque cursor from next_cursor; "
                                              "empty: the first page")] = None,
) -> PageParams:
    return PageParams(limit=limit, cursor=cursor or None)


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


def paginate(
    session: Session,
    stmt: Select[T],
    *,
    key: InstrumentedAttribute[int],
    params: PageParams,
    descending: bool = False,
) -> Page[T]:
    """Run `stmt` ordered by `key`, after `params.cursor`, returning one page."""
    if params.cursor is not None:
        after = decode_cursor(params.cursor)
        stmt = stmt.where(key < after if descending else key > after)
    stmt = stmt.order_by(key.desc() if descending else key.asc()).limit(params.limit + 1)
    rows: Sequence[T] = session.scalars(stmt).unique().all()
    items = list(rows[: params.limit])
    next_cursor = None
    if len(rows) > params.limit:
        last = items[-1]
        next_cursor = encode_cursor(int(getattr(last, key.key)))
    return Page(items=items, next_cursor=next_cursor)


class PageOut(BaseModel, Generic[Item]):
    """`{"items": [...], "next_cursor": str | null}`."""

    items: list[Item]
    next_cursor: str | None


def page_out(page: Page[T], convert: Callable[[T], Any]) -> dict[str, Any]:
    return {"items": [convert(item) for item in page.items], "next_cursor": page.next_cursor}
