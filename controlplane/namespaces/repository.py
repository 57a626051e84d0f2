"""Namespace queries."""

from __future__ import annotations

from sqlalchemy import select

from controlplane.kit.repository import Repository
from controlplane.models import Namespace


class NamespaceRepository(Repository[Namespace]):
    model = Namespace
    noun = "namespace"

    def by_name(self, name: str) -> Namespace | None:
        return self.get_one_or_none(select(Namespace).where(Namespace.name == name))

    def get_by_name(self, name: str) -> Namespace:
        return self.get_one(select(Namespace).where(Namespace.name == name), what=name)

    def lock_by_name(self, name: str) -> Namespace:
        """The row, locked for update until the transaction ends (404 if unknown)."""
        return self.get_one(select(Namespace).where(Namespace.name == name)
                            .with_for_update(), what=name)
