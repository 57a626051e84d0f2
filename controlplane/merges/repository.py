"""Merged-release queries."""

from __future__ import annotations

from sqlalchemy import Select, select

from controlplane.errors import NotFound
from controlplane.kit.repository import Repository
from controlplane.models import Merge, MergeState

DIGEST_REF_PREFIX = "sha256:"


class MergeRepository(Repository[Merge]):
    model = Merge
    noun = "merge"

    def in_namespace(self, namespace_id: int, state: str | None = None) -> Select[Merge]:
        stmt = select(Merge).where(Merge.namespace_id == namespace_id)
        if state is not None:
            stmt = stmt.where(Merge.state == state)
        return stmt

    def by_request(self, namespace_id: int, request_sha256: str) -> Merge | None:
        return self.get_one_or_none(select(Merge).where(
            Merge.namespace_id == namespace_id, Merge.request_sha256 == request_sha256))

    def producing(self, base_id: int) -> list[Merge]:
        """Merged releases whose output is base `base_id`, oldest first."""
        stmt = (select(Merge).where(Merge.merged_base_id == base_id,
                                    Merge.state == MergeState.MERGED.value)
                .order_by(Merge.id))
        return list(self.session.scalars(stmt).unique())

    def get_by_ref(self, namespace_id: int, ref: str) -> Merge:
        """`ref`: a merge id, or `sha256:<H_merged>` (the oldest merged one)."""
        if ref.startswith(DIGEST_REF_PREFIX):
            stmt = (self.in_namespace(namespace_id, MergeState.MERGED.value)
                    .where(Merge.digest == ref[len(DIGEST_REF_PREFIX):])
                    .order_by(Merge.id).limit(1))
        elif ref.isascii() and ref.isdigit():
            stmt = self.in_namespace(namespace_id).where(Merge.id == int(ref))
        else:
            raise NotFound(f"merge not found: {ref}", detail={"kind": "merge", "ref": ref})
        return self.get_one(stmt, what=ref)
