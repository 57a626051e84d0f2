"""/v1/namespaces/{ns}/aliases: resolve, list, history (read); publish, retire,
rollback (publish scope; optional `Idempotency-Key` header); PATCH an alias's hot mark
(admin on '*')."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Engine

from controlplane.artifacts.convert import artifact_summary
from controlplane.auth.dependencies import Credentials, CurrentPrincipal, bearer_plaintext
from controlplane.auth.scopes import Principal, Role
from controlplane.catalog.hot import set_hot
from controlplane.catalog.repository import AliasRepository, GenerationRepository
from controlplane.catalog.resolution import (
    list_resolutions,
    read_alias,
    read_generation,
    resolve_as,
    resolve_as_async,
)
from controlplane.catalog.schemas import (
    ALIAS_PATTERN,
    AliasPatch,
    GenerationOut,
    PublishRequest,
    ReleaseSummary,
    ResolutionOut,
    RetireRequest,
    RollbackRequest,
)
from controlplane.catalog.service import CatalogRequest, apply_change
from controlplane.errors import NotFound
from controlplane.kit.async_reads import AsyncReads
from controlplane.kit.deps import SessionDep, StoreDep, read_connection, run_read
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.models import CatalogAction, CatalogGeneration, Merge
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage import ObjectStore

router = APIRouter(prefix="/v1/namespaces/{namespace}/aliases", tags=["catalog"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)]
AliasName = Annotated[str, Path(pattern=ALIAS_PATTERN, description="Alias name: 1-200 of "
                                "`[A-Za-z0-9._-]`, starting and ending alphanumeric.")]
CREATED: dict[int | str, dict[str, Any]] = {
    200: {"model": GenerationOut, "description": "Idempotent replay."}}


def generation_out(gen: CatalogGeneration) -> GenerationOut:
    return GenerationOut(
        namespace=gen.alias.namespace.name, alias=gen.alias.name, generation=gen.generation,
        action=gen.action,  # type: ignore[arg-type]
        artifact=artifact_summary(gen.artifact) if gen.artifact is not None else None,
        release=release_summary(gen.merge) if gen.merge is not None else None,
        actor=gen.actor, reason=gen.reason, created_at=gen.created_at)


def release_summary(merge: Merge) -> ReleaseSummary:
    assert merge.digest is not None and merge.merged_base is not None  # published: merged
    return ReleaseSummary(id=merge.id, name=merge.name, digest=merge.digest,
                          base=merge.merged_base.h_base)


def _change(session: Any, store: ObjectStore, principal: Principal, response: Response,
            req: CatalogRequest) -> GenerationOut:
    principal.require(req.namespace, Role.PUBLISH)
    gen, created = apply_change(session, req, store)
    if not created:
        response.status_code = status.HTTP_200_OK
    alias_id, number = gen.alias_id, gen.generation
    session.rollback()  # the change is committed; read the response in autocommit
    with read_connection(session.get_bind()) as conn:
        return read_generation(conn, req.namespace, req.alias, alias_id, number)


# declared first: routes are matched in declaration order and this is the hot path
@router.get("/{alias}", response_model=ResolutionOut)
async def get_resolution(namespace: str, alias: AliasName, request: Request,
                         credentials: Credentials) -> Response:
    """The current generation; 404 never published, 410 ALIAS_RETIRED when retired.

    The hot path: authentication and resolution are one statement on one pooled
    connection (catalog/resolution.py), on the event loop on Postgres
    (kit/async_reads.py) and in a single threadpool hop on SQLite; the body is
    serialised once instead of being re-validated against the response model.
    """
    token = bearer_plaintext(credentials)
    reads: AsyncReads | None = request.app.state.async_reads
    if reads is not None:  # Postgres: on the event loop
        out = await resolve_as_async(reads, token, namespace, alias)
    else:
        out = await run_in_threadpool(_resolve, request.app.state.read_engine, token,
                                      namespace, alias)
    return Response(out.model_dump_json(), media_type="application/json")


def _resolve(engine: Engine, token: str, namespace: str, alias: str) -> ResolutionOut:
    return run_read(engine, lambda conn: resolve_as(conn, token, namespace, alias))


@router.post("/{alias}/publish", status_code=status.HTTP_201_CREATED,
             response_model=GenerationOut, responses=CREATED)
def publish(namespace: str, alias: AliasName, body: PublishRequest, principal: CurrentPrincipal,
            session: SessionDep, store: StoreDep, response: Response,
            idempotency_key: IdempotencyKey = None) -> GenerationOut:
    return _change(session, store, principal, response, CatalogRequest(
        namespace=namespace, alias=alias, action=CatalogAction.PUBLISH, actor=principal.actor,
        artifact_ref=body.artifact, release_ref=body.release,
        expected_generation=body.expected_generation,
        reason=body.reason, idempotency_key=idempotency_key))


@router.post("/{alias}/retire", status_code=status.HTTP_201_CREATED,
             response_model=GenerationOut, responses=CREATED)
def retire(namespace: str, alias: AliasName, body: RetireRequest, principal: CurrentPrincipal,
           session: SessionDep, store: StoreDep, response: Response,
           idempotency_key: IdempotencyKey = None) -> GenerationOut:
    return _change(session, store, principal, response, CatalogRequest(
        namespace=namespace, alias=alias, action=CatalogAction.RETIRE, actor=principal.actor,
        expected_generation=body.expected_generation, reason=body.reason,
        idempotency_key=idempotency_key))


@router.post("/{alias}/rollback", status_code=status.HTTP_201_CREATED,
             response_model=GenerationOut, responses=CREATED)
def rollback(namespace: str, alias: AliasName, body: RollbackRequest, principal: CurrentPrincipal,
             session: SessionDep, store: StoreDep, response: Response,
             idempotency_key: IdempotencyKey = None) -> GenerationOut:
    return _change(session, store, principal, response, CatalogRequest(
        namespace=namespace, alias=alias, action=CatalogAction.ROLLBACK, actor=principal.actor,
        expected_generation=body.expected_generation, to_generation=body.to_generation,
        reason=body.reason, idempotency_key=idempotency_key))


@router.patch("/{alias}", response_model=ResolutionOut)
def patch_alias(namespace: str, alias: AliasName, body: AliasPatch, request: Request,
                principal: CurrentPrincipal, session: SessionDep) -> ResolutionOut:
    """Mark the alias hot (or not): placement keeps its current artifact resident on
    every compatible agent with room, so a publication to it is loaded before any
    request arrives.

    Admin on '*' only: a hot mark claims adapter slots on every agent of the fleet,
    against every other namespace's adapters (as a namespace weight does). Audited;
    waiting agents' long-polls wake on the change. Answers the alias's resolution with
    its mark, retired or not (a retired alias has nothing to prefetch until it is
    published again, and keeps its mark).
    """
    principal.require_global(Role.ADMIN)
    row = set_hot(session, namespace=namespace, alias=alias, hot=body.hot,
                  actor=principal.actor)
    alias_id = row.id
    session.rollback()  # the change is committed; read the response in autocommit
    engine: Engine = request.app.state.engine
    with read_connection(engine) as conn:
        return read_alias(conn, namespace, alias, alias_id)


@router.get("", response_model=PageOut[ResolutionOut])
def list_aliases(namespace: str, principal: CurrentPrincipal, session: SessionDep,
                 params: Annotated[PageParams, Depends(page_params)]) -> dict[str, Any]:
    """Every published alias with its current generation (retired ones included)."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    return list_resolutions(session.connection(), ns.id, namespace, params)


@router.get("/{alias}/history", response_model=PageOut[GenerationOut])
def history(namespace: str, alias: AliasName, principal: CurrentPrincipal, session: SessionDep,
            params: Annotated[PageParams, Depends(page_params)]) -> dict[str, Any]:
    """Every generation, newest first."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    found = AliasRepository(session).by_name(ns.id, alias)
    if found is None:
        raise NotFound(f"alias {namespace}/{alias} not found",
                       detail={"namespace": namespace, "alias": alias})
    generations = GenerationRepository(session)
    page = generations.paginate(generations.history(found.id),
                                key=CatalogGeneration.generation,
                                params=params, descending=True)
    return page_out(page, generation_out)
