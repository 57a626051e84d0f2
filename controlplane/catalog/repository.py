"""Alias and generation queries, including the row lock that serialises writers."""

from __future__ import annotations

from sqlalchemy import Select, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, lazyload

from controlplane.kit.repository import Repository
from controlplane.models import Alias, CatalogGeneration, utcnow


class AliasRepository(Repository[Alias]):
    model = Alias
    noun = "alias"

    def by_name(self, namespace_id: int, name: str) -> Alias | None:
        return self.get_one_or_none(self._by_name(namespace_id, name))

    def lock(self, namespace_id: int, name: str) -> Alias | None:
        """SELECT ... FOR UPDATE on the alias row (Postgres); SQLite holds the DB lock.
        Only the row: its namespace and base load on access (error paths)."""
        return self.get_one_or_none(self._by_name(namespace_id, name)
                                    .options(lazyload("*")).with_for_update(of=Alias))

    def ensure(self, namespace_id: int, name: str, base_id: int) -> None:
        """Insert the alias row unless it exists (race-free: ON CONFLICT DO NOTHING)."""
        values = {"namespace_id": namespace_id, "name": name, "base_id": base_id,
                  "current_generation": 0, "created_at": utcnow()}
        insert = pg_insert if self.session.get_bind().dialect.name == "postgresql" else (
            sqlite_insert)
        stmt = insert(Alias).values(**values).on_conflict_do_nothing(
            index_elements=["namespace_id", "name"])
        self.session.execute(stmt)

    def in_namespace(self, namespace_id: int) -> Select[Alias]:
        return select(Alias).where(Alias.namespace_id == namespace_id,
                                   Alias.current_generation > 0)

    @staticmethod
    def _by_name(namespace_id: int, name: str) -> Select[Alias]:
        return select(Alias).where(Alias.namespace_id == namespace_id, Alias.name == name)


class GenerationRepository(Repository[CatalogGeneration]):
    model = CatalogGeneration
    noun = "generation"

    def __init__(self, session: Session) -> None:
        super().__init__(session)

    def get(self, alias_id: int, generation: int) -> CatalogGeneration | None:
        """The row alone (relationships load on access), as writers need only its ids."""
        return self.get_one_or_none(select(CatalogGeneration).options(lazyload("*")).where(
            CatalogGeneration.alias_id == alias_id, CatalogGeneration.generation == generation))

    def by_idempotency_key(self, alias_id: int, key: str) -> CatalogGeneration | None:
        return self.get_one_or_none(select(CatalogGeneration).where(
            CatalogGeneration.alias_id == alias_id, CatalogGeneration.idempotency_key == key))

    def history(self, alias_id: int) -> Select[CatalogGeneration]:
        return select(CatalogGeneration).where(CatalogGeneration.alias_id == alias_id)

    def previous_target(self, alias_id: int, below: int,
                        current: tuple[int | None, int | None]) -> CatalogGeneration | None:
        """Newest generation < `below` that points at a target (an artifact or a merged
        release) other than `current` (artifact_id, merge_id)."""
        gen = CatalogGeneration
        stmt = (select(gen).options(lazyload("*"))
                .where(gen.alias_id == alias_id, gen.generation < below,
                       or_(gen.artifact_id.is_not(None), gen.merge_id.is_not(None)))
                .order_by(gen.generation.desc()))
        artifact_id, merge_id = current
        if artifact_id is not None:
            stmt = stmt.where(or_(gen.artifact_id.is_(None), gen.artifact_id != artifact_id))
        if merge_id is not None:
            stmt = stmt.where(or_(gen.merge_id.is_(None), gen.merge_id != merge_id))
        return self.get_one_or_none(stmt.limit(1))
