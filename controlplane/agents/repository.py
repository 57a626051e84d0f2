"""Agent rows and the catalog queries desired state is built from."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, or_, select

from controlplane.kit.repository import Repository
from controlplane.models import Alias, BaseModel, CatalogGeneration, Merge
from controlplane.models.agent import Agent


class AgentRepository(Repository[Agent]):
    model = Agent
    noun = "agent"

    def by_name(self, name: str) -> Agent | None:
        return self.get_one_or_none(select(Agent).where(Agent.name == name))

    def for_base(self, h_base: str) -> Sequence[Agent]:
        return self.session.scalars(
            select(Agent).where(Agent.h_base == h_base).order_by(Agent.id)).all()

    def catalog_version(self) -> int:
        """Monotonic catalog change counter: the newest generation row's id (0: none).
        Generation rows are append-only, so it grows with every publish/retire/rollback."""
        return int(self.session.scalar(select(func.max(CatalogGeneration.id))) or 0)

    def aliases_for_base(self, h_base: str) -> Sequence[Alias]:
        """Published aliases an agent of `h_base` may serve: those of that base, and those
        with a generation that serves a merged release whose checkpoint is that base."""
        released = (select(CatalogGeneration.alias_id)
                    .join(Merge, Merge.id == CatalogGeneration.merge_id)
                    .join(BaseModel, BaseModel.id == Merge.merged_base_id)
                    .where(BaseModel.h_base == h_base))
        own = select(BaseModel.id).where(BaseModel.h_base == h_base).scalar_subquery()
        return self.session.scalars(
            select(Alias).where(or_(Alias.base_id == own, Alias.id.in_(released)),
                                Alias.current_generation > 0)
            .order_by(Alias.id)).unique().all()

    def recent_generations(self, alias_id: int, limit: int) -> Sequence[CatalogGeneration]:
        return self.session.scalars(
            select(CatalogGeneration).where(CatalogGeneration.alias_id == alias_id)
            .order_by(CatalogGeneration.generation.desc()).limit(limit)).unique().all()
