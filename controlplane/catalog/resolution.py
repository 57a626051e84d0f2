"""Authenticate and resolve an alias in one statement (the registry's hot path).

`resolve_as` runs one Core `SELECT` driven by the caller's token row:

    api_tokens (by hash, not revoked)
      ⟕ namespaces (by name) ⟕ aliases (by name) ⟕ base_models (alias base)
      ⟕ catalog_generations (the alias's current one) ⟕ artifacts

It returns at most one row, exactly when the token is valid, carrying the principal's
columns and only the columns a `ResolutionOut` needs — no ORM identity map and no
JSONB column besides the token's grants (`base_models.abi`, `artifacts.modules/files/
validated_record` stay on disk). Errors come in the same order as on every other
route: 401 (no row), 403 (scope, checked in Python on the fetched grants), 404
(namespace, alias never published), 410 (current generation is a retire). Because the
token is read in the same statement, revocation is effective at once (no cache).

Invariant relied on: an alias's generations only point at artifacts of the alias's
own base, or at merged releases made from it (publish enforces it with BASE_MISMATCH;
rollback only re-points at targets an earlier publish accepted), so the artifact
summary's `base` is the alias's `h_base`; a release's own base is read through
`merges.merged_base_id`.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Connection, and_, bindparam, select
from sqlalchemy.sql import ColumnElement

from controlplane.artifacts.schemas import ArtifactSummary
from controlplane.auth.scopes import Role
from controlplane.auth.service import (
    PRINCIPAL_COLUMNS,
    hash_token,
    principal_from_row,
    token_matches,
)
from controlplane.catalog.schemas import GenerationOut, ReleaseSummary, ResolutionOut
from controlplane.errors import AliasRetired, NotFound, Unauthenticated
from controlplane.kit.async_reads import AsyncReads, CompiledRead
from controlplane.kit.pagination import PageParams, decode_cursor, encode_cursor
from controlplane.models import (
    Alias,
    ApiToken,
    Artifact,
    BaseModel,
    CatalogGeneration,
    Merge,
    Namespace,
)

_tokens = ApiToken.__table__
_ns = Namespace.__table__
_alias = Alias.__table__
_gen = CatalogGeneration.__table__
_art = Artifact.__table__
_base = BaseModel.__table__
_merge = Merge.__table__
_release_base = BaseModel.__table__.alias("release_base")

RELEASE_COLUMNS: tuple[ColumnElement[object], ...] = (
    _gen.c.merge_id, _merge.c.name.label("release_name"),
    _merge.c.digest.label("release_digest"), _release_base.c.h_base.label("release_base"))
"""What a generation's release summary needs (joined by `_with_release`)."""


def _with_release(joined: Any) -> Any:
    """`joined` (a FROM clause holding `catalog_generations`) with the generation's merged
    release and its base outer-joined."""
    return (joined.outerjoin(_merge, _merge.c.id == _gen.c.merge_id)
            .outerjoin(_release_base, _release_base.c.id == _merge.c.merged_base_id))


RESOLVE_AS = (
    select(
        *PRINCIPAL_COLUMNS,
        _ns.c.id.label("namespace_id"),
        _alias.c.id.label("alias_id"),
        _alias.c.current_generation,
        _alias.c.hot,
        _base.c.h_base,
        _gen.c.generation,
        _gen.c.action,
        _gen.c.artifact_id,
        _gen.c.actor,
        _gen.c.reason,
        _gen.c.created_at,
        _art.c.digest,
        _art.c.method,
        *RELEASE_COLUMNS,
    )
    .select_from(_with_release(
        _tokens.outerjoin(_ns, _ns.c.name == bindparam("namespace_name"))
        .outerjoin(_alias, and_(_alias.c.namespace_id == _ns.c.id,
                                _alias.c.name == bindparam("alias_name")))
        .outerjoin(_base, _base.c.id == _alias.c.base_id)
        .outerjoin(_gen, and_(_gen.c.alias_id == _alias.c.id,
                              _gen.c.generation == _alias.c.current_generation))
        .outerjoin(_art, _art.c.id == _gen.c.artifact_id)))
    .where(token_matches(bindparam("token_sha256")))
)


def resolve_as(conn: Connection, token: str, namespace: str, alias: str) -> ResolutionOut:
    """The alias's current generation, as seen by the holder of `token` (plaintext).

    Raises Unauthenticated, Forbidden (no read on `namespace`), NotFound (namespace
    missing; alias missing or never published) or AliasRetired.
    """
    row = conn.execute(RESOLVE_AS, _resolve_params(token, namespace, alias)).first()
    return resolution_of(row, namespace, alias)


async def resolve_as_async(reads: AsyncReads, token: str, namespace: str,
                           alias: str) -> ResolutionOut:
    """`resolve_as` on the event loop (Postgres; kit/async_reads.py)."""
    row = await reads.fetch_one(RESOLVE_READ, _resolve_params(token, namespace, alias))
    return resolution_of(row, namespace, alias)


def _resolve_params(token: str, namespace: str, alias: str) -> dict[str, str]:
    return {"token_sha256": hash_token(token), "namespace_name": namespace,
            "alias_name": alias}


def resolution_of(row: Any, namespace: str, alias: str) -> ResolutionOut:
    """The row of `RESOLVE_AS` (None: no such token) -> the resolution or its error."""
    if row is None:
        raise Unauthenticated("unknown or revoked token")
    principal_from_row(row).require(namespace, Role.READ)
    if row.namespace_id is None:
        raise NotFound(f"namespace not found: {namespace}",
                       detail={"kind": "namespace", "ref": namespace})
    where = {"namespace": namespace, "alias": alias}
    if row.alias_id is None or row.current_generation == 0 or row.generation is None:
        raise NotFound(f"alias {namespace}/{alias} was never published", detail=where)
    if row.artifact_id is None and row.merge_id is None:
        raise AliasRetired(f"alias {namespace}/{alias} is retired",
                           detail={**where, "generation": row.generation})
    return _resolution(row, namespace, alias, hot=row.hot)


RESOLVE_READ = CompiledRead(RESOLVE_AS)


def _resolution(row: Any, namespace: str, alias: str, *, hot: bool = False) -> ResolutionOut:
    """A row with the generation, artifact and `h_base` columns -> ResolutionOut (`hot`:
    the alias's mark, which generation rows do not carry)."""
    summary = None if row.artifact_id is None else ArtifactSummary(
        id=row.artifact_id, digest=row.digest, base=row.h_base, method=row.method)
    release = None if row.merge_id is None else ReleaseSummary(
        id=row.merge_id, name=row.release_name, digest=row.release_digest,
        base=row.release_base)
    return ResolutionOut(
        namespace=namespace, alias=alias, generation=row.generation,
        action=cast(Any, row.action), artifact=summary, release=release, actor=row.actor,
        reason=row.reason, created_at=row.created_at, base=row.h_base, hot=hot)


LIST = (
    select(_alias.c.id.label("alias_id"), _alias.c.name.label("alias_name"), _alias.c.hot,
           _base.c.h_base,
           _gen.c.generation, _gen.c.action, _gen.c.artifact_id, _gen.c.actor, _gen.c.reason,
           _gen.c.created_at, _art.c.digest, _art.c.method, *RELEASE_COLUMNS)
    .select_from(_with_release(
        _alias.join(_base, _base.c.id == _alias.c.base_id)
        .join(_gen, and_(_gen.c.alias_id == _alias.c.id,
                         _gen.c.generation == _alias.c.current_generation))
        .outerjoin(_art, _art.c.id == _gen.c.artifact_id)))
)


def list_resolutions(conn: Connection, namespace_id: int, namespace: str,
                     params: PageParams) -> dict[str, Any]:
    """One keyset page (by alias id, ascending) of every published alias's current
    generation, retired ones included; one statement, no JSONB column."""
    stmt = LIST.where(_alias.c.namespace_id == namespace_id)
    if params.cursor is not None:
        stmt = stmt.where(_alias.c.id > decode_cursor(params.cursor))
    rows = conn.execute(stmt.order_by(_alias.c.id).limit(params.limit + 1)).all()
    items = [_resolution(row, namespace, row.alias_name, hot=row.hot)
             for row in rows[: params.limit]]
    more = len(rows) > params.limit
    return {"items": items,
            "next_cursor": encode_cursor(rows[params.limit - 1].alias_id) if more else None}


def read_alias(conn: Connection, namespace: str, alias: str, alias_id: int) -> ResolutionOut:
    """The alias's current generation and hot mark as a resolution, retired or not (what
    the alias PATCH returns after its commit). The alias must have been published."""
    row = conn.execute(LIST.where(_alias.c.id == alias_id)).one()
    return _resolution(row, namespace, alias, hot=row.hot)


GENERATION = (
    select(_gen.c.generation, _gen.c.action, _gen.c.artifact_id, _gen.c.actor, _gen.c.reason,
           _gen.c.created_at, _art.c.digest, _art.c.method, _base.c.h_base, *RELEASE_COLUMNS)
    .select_from(_with_release(
        _gen.join(_alias, _alias.c.id == _gen.c.alias_id)
        .join(_base, _base.c.id == _alias.c.base_id)
        .outerjoin(_art, _art.c.id == _gen.c.artifact_id)))
    .where(_gen.c.alias_id == bindparam("alias_id"), _gen.c.generation == bindparam("generation"))
)


def read_generation(conn: Connection, namespace: str, alias: str, alias_id: int,
                   generation: int) -> GenerationOut:
    """One generation as a response, in one statement without JSONB columns (what a
    publish/retire/rollback returns after its commit). The generation must exist."""
    row = conn.execute(GENERATION, {"alias_id": alias_id, "generation": generation}).one()
    resolution = _resolution(row, namespace, alias)
    return GenerationOut.model_validate(resolution.model_dump(exclude={"base", "hot"}))
