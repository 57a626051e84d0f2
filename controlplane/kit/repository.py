"""Generic repository: typed get/get-or-none/paginate over one ORM model."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy import Select, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from controlplane.errors import NotFound
from controlplane.kit.pagination import Page, PageParams, paginate

M = TypeVar("M")


class Repository(Generic[M]):
    """Subclasses set `model` and `noun`; queries run in the caller's session."""

    model: ClassVar[type[Any]]
    noun: ClassVar[str] = "object"

    def __init__(self, session: Session) -> None:
        self.session = session

    def select(self) -> Select[M]:
        return select(self.model)

    def get_one_or_none(self, stmt: Select[M]) -> M | None:
        result: M | None = self.session.scalars(stmt).unique().one_or_none()
        return result

    def get_one(self, stmt: Select[M], *, what: str = "") -> M:
        found = self.get_one_or_none(stmt)
        if found is None:
            raise NotFound(f"{self.noun} not found{': ' + what if what else ''}",
                           detail={"kind": self.noun, "ref": what})
        return found

    def get_by_id(self, id_: int) -> M | None:
        result: M | None = self.session.get(self.model, id_)
        return result

    def paginate(
        self,
        stmt: Select[M],
        *,
        key: InstrumentedAttribute[int],
        params: PageParams,
        descending: bool = False,
    ) -> Page[M]:
        return paginate(self.session, stmt, key=key, params=params, descending=descending)

    def add(self, obj: M) -> M:
        self.session.add(obj)
        self.session.flush()
        return obj
