"""Artifact queries."""

from __future__ import annotations

from sqlalchemy import Select, select
from sqlalchemy.orm import lazyload, load_only

from controlplane.errors import NotFound
from controlplane.kit.repository import Repository
from controlplane.models import Artifact, ArtifactState

DIGEST_REF_PREFIX = "sha256:"


class ArtifactRepository(Repository[Artifact]):
    model = Artifact
    noun = "artifact"

    def in_namespace(self, namespace_id: int, state: str | None = None) -> Select[Artifact]:
        stmt = select(Artifact).where(Artifact.namespace_id == namespace_id)
        if state is not None:
            stmt = stmt.where(Artifact.state == state)
        return stmt

    def by_upload(self, namespace_id: int, base_id: int, upload_sha256: str) -> Artifact | None:
        return self.get_one_or_none(select(Artifact).where(
            Artifact.namespace_id == namespace_id, Artifact.base_id == base_id,
            Artifact.upload_sha256 == upload_sha256))

    def get_by_ref(self, namespace_id: int, ref: str, *, lean: bool = False,
                   with_files: bool = False, hold: bool = False) -> Artifact:
        """`ref` is an artifact id, or `sha256:<H_artifact>` (the oldest validated artifact
        with that digest in the namespace: equal digests mean equal adapters).

        `lean`: load only the scalar columns a catalog change needs (no JSONB column, no
        joined namespace/base; those load on access); `with_files` adds the `files` column
        (what a blob check reads); `hold`: share-lock the row until the transaction ends,
        for a new row that will name it as a source (an artifact delete locks it for update,
        so it either waits and then sees the new reference, or deleted it first and this is
        NotFound)."""
        if ref.startswith(DIGEST_REF_PREFIX):
            digest = ref[len(DIGEST_REF_PREFIX):]
            stmt = (self.in_namespace(namespace_id, ArtifactState.VALIDATED.value)
                    .where(Artifact.digest == digest).order_by(Artifact.id).limit(1))
        elif ref.isascii() and ref.isdigit():
            stmt = self.in_namespace(namespace_id).where(Artifact.id == int(ref))
        else:
            raise NotFound(f"artifact not found: {ref}",
                           detail={"kind": "artifact", "ref": ref})
        if lean:
            columns = [Artifact.id, Artifact.namespace_id, Artifact.base_id, Artifact.state,
                       Artifact.digest, Artifact.method]
            if with_files:
                columns.append(Artifact.files)
            stmt = stmt.options(lazyload("*"), load_only(*columns))
        if hold:
            stmt = stmt.with_for_update(read=True, of=Artifact)
        return self.get_one(stmt, what=ref)
