"""Base-model queries."""

from __future__ import annotations

from sqlalchemy import select

from controlplane.kit.repository import Repository
from controlplane.models import BaseModel


class BaseModelRepository(Repository[BaseModel]):
    model = BaseModel
    noun = "base model"

    def by_h_base(self, h_base: str) -> BaseModel | None:
        return self.get_one_or_none(select(BaseModel).where(BaseModel.h_base == h_base))

    def get_by_h_base(self, h_base: str) -> BaseModel:
        return self.get_one(select(BaseModel).where(BaseModel.h_base == h_base), what=h_base)
