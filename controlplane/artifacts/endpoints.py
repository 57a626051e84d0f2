"""/v1/namespaces/{ns}/artifacts: push and delete (publish scope), list and get (read
scope)."""

from __future__ import annotations

from typing import IO, Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Query, Request, Response, status
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from controlplane.artifacts.convert import artifact_out
from controlplane.artifacts.deletion import delete_artifact
from controlplane.artifacts.repository import ArtifactRepository
from controlplane.artifacts.schemas import ArtifactImport, ArtifactOut
from controlplane.artifacts.service import push_artifact
from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.bases.repository import BaseModelRepository
from controlplane.errors import BadRequest, ErrorBody
from controlplane.kit.deps import JobsDep, SessionDep, SettingsDep, StoreDep
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.models import Artifact
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage import ADAPTER_FILES, import_prefix
from controlplane.storage.importing import check_listing

router = APIRouter(prefix="/v1/namespaces/{namespace}/artifacts", tags=["artifacts"])

PUSH_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": ArtifactImport.model_json_schema()},
            "multipart/form-data": {"schema": {
                "type": "object",
                "required": ["base", *ADAPTER_FILES],
                "properties": {
                    "base": {"type": "string", "description": "H_base"},
                    **{name: {"type": "string", "format": "binary"} for name in ADAPTER_FILES},
                },
            }},
        },
    }
}


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=ArtifactOut,
             openapi_extra=PUSH_BODY,
             responses={200: {"model": ArtifactOut,
                              "description": "Same bytes and base already pushed here."},
                        413: {"model": ErrorBody, "description": "Body or artifact over its "
                              "limit (REQUEST_TOO_LARGE, ARTIFACT_TOO_LARGE)."}})
async def push(namespace: str, request: Request, principal: CurrentPrincipal,
               session: SessionDep, store: StoreDep, jobs: JobsDep, settings: SettingsDep,
               response: Response) -> ArtifactOut:
    """Upload (multipart) or import (JSON `{base, uri}`) an adapter; validation runs later.

    The body is counted as it streams in, chunked or not (multipart: `max_artifact_bytes`
    plus framing, 413 ARTIFACT_TOO_LARGE; JSON: `max_json_body_bytes`, 413
    REQUEST_TOO_LARGE)."""
    principal.require(namespace, Role.PUBLISH)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form(max_files=4, max_fields=8)
        try:
            base = form.get("base")
            if not isinstance(base, str):
                raise BadRequest("multipart field 'base' (H_base) is required")
            unexpected = sorted(set(form.keys()) - {"base", *ADAPTER_FILES})
            if unexpected:
                check_listing([*unexpected, *form.keys()], "multipart")  # pickle -> 422
                raise BadRequest("unexpected multipart fields", detail={"fields": unexpected})
            check_listing([k for k, v in form.multi_items() if isinstance(v, UploadFile)],
                          "multipart")
            streams: dict[str, IO[bytes]] = {}
            for name in ADAPTER_FILES:
                part = form.get(name)
                if not isinstance(part, UploadFile):
                    raise BadRequest(f"multipart field {name!r} must be a file",
                                     detail={"field": name})
                streams[name] = part.file
            artifact, created = await run_in_threadpool(
                push_artifact, session, store, jobs, settings, namespace=namespace, h_base=base,
                files=streams, actor=principal.actor, source="upload")
        finally:
            await form.close()
    else:
        try:
            body = ArtifactImport.model_validate_json(await request.body())
        except ValidationError as exc:
            raise BadRequest("invalid push body: send multipart files or JSON {base, uri}",
                             detail={"errors": exc.errors(include_url=False,
                                                          include_context=False)}) from exc
        artifact, created = await run_in_threadpool(
            _push_uri, session, store, jobs, settings, namespace, body, principal.actor)
    if not created:
        response.status_code = status.HTTP_200_OK
    return artifact_out(artifact)


def _push_uri(session: Any, store: Any, jobs: Any, settings: Any, namespace: str,
              body: ArtifactImport, actor: str) -> tuple[Artifact, bool]:
    NamespaceRepository(session).get_by_name(namespace)  # 404s before any download
    BaseModelRepository(session).get_by_h_base(body.base)
    session.rollback()
    with import_prefix(body.uri, settings) as handles:
        return push_artifact(session, store, jobs, settings, namespace=namespace,
                             h_base=body.base, files=handles, actor=actor, source=body.uri)


@router.get("", response_model=PageOut[ArtifactOut])
def list_artifacts(
    namespace: str, principal: CurrentPrincipal, session: SessionDep,
    params: Annotated[PageParams, Depends(page_params)],
    state: Annotated[Literal["pending", "validating", "validated", "rejected"] | None,
                     Query()] = None,
) -> dict[str, Any]:
    """Newest first."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    repo = ArtifactRepository(session)
    page = repo.paginate(repo.in_namespace(ns.id, state), key=cast(Any, Artifact.id),
                         params=params, descending=True)
    return page_out(page, artifact_out)


@router.get("/{ref}", response_model=ArtifactOut)
def get_artifact(namespace: str, ref: str, principal: CurrentPrincipal,
                 session: SessionDep) -> ArtifactOut:
    """`ref`: artifact id or `sha256:<H_artifact>`."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    return artifact_out(ArtifactRepository(session).get_by_ref(ns.id, ref))


@router.delete("/{ref}", response_model=ArtifactOut,
               responses={409: {"model": ErrorBody, "description": "A catalog generation "
                                "(current or historical) or a collection references the "
                                "artifact (ARTIFACT_REFERENCED); nothing is deleted."}})
def delete(namespace: str, ref: str, principal: CurrentPrincipal,
           session: SessionDep) -> ArtifactOut:
    """Delete an artifact nothing references (never published, no collection's source):
    the row goes, audited (`artifact.delete`); its blobs stay until blob GC finds them
    unreferenced. Answers the artifact as it was."""
    principal.require(namespace, Role.PUBLISH)
    return artifact_out(delete_artifact(session, namespace=namespace, ref=ref,
                                        actor=principal.actor))
