"""Collection queries."""

from __future__ import annotations

from sqlalchemy import Select, select

from controlplane.errors import NotFound
from controlplane.kit.repository import Repository
from controlplane.models import Collection, CollectionState

DIGEST_REF_PREFIX = "sha256:"


class CollectionRepository(Repository[Collection]):
    model = Collection
    noun = "collection"

    def in_namespace(self, namespace_id: int, state: str | None = None) -> Select[Collection]:
        stmt = select(Collection).where(Collection.namespace_id == namespace_id)
        if state is not None:
            stmt = stmt.where(Collection.state == state)
        return stmt

    def by_request(self, namespace_id: int, request_sha256: str) -> Collection | None:
        return self.get_one_or_none(select(Collection).where(
            Collection.namespace_id == namespace_id,
            Collection.request_sha256 == request_sha256))

    def get_by_ref(self, namespace_id: int, ref: str) -> Collection:
        """`ref`: a collection id, or `sha256:<H_collection>` (the oldest fitted one)."""
        if ref.startswith(DIGEST_REF_PREFIX):
            stmt = (self.in_namespace(namespace_id, CollectionState.FITTED.value)
                    .where(Collection.digest == ref[len(DIGEST_REF_PREFIX):])
                    .order_by(Collection.id).limit(1))
        elif ref.isascii() and ref.isdigit():
            stmt = self.in_namespace(namespace_id).where(Collection.id == int(ref))
        else:
            raise NotFound(f"collection not found: {ref}",
                           detail={"kind": "collection", "ref": ref})
        return self.get_one(stmt, what=ref)
