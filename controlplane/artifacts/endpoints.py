"""/v1/namespaces/{ns}/artifacts: push (publish scope), list and get (read scope)."""

from __future__ import annotations

from typing import IO, Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Query, Request, Response, status
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from controlplane.artifacts.convert import artifact_out
from controlplane.artifacts.repository import ArtifactRepository
from controlplane.artifacts.schemas import ArtifactImport, ArtifactOut
from controlplane.artifacts.service import push_artifact
from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.bases.repository import BaseModelRepository
from controlplane.errors import ArtifactTooLarge, BadRequest, RequestTooLarge
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
                              "description": "Same bytes and base already pushed here."}})
async def push(namespace: str, request: Request, principal: CurrentPrincipal,
               session: SessionDep, store: StoreDep, jobs: JobsDep, settings: SettingsDep,
               response: Response) -> ArtifactOut:
    """Upload (multipart) or import (JSON `{base, uri}`) an adapter; validation runs later."""
    principal.require(namespace, Role.PUBLISH)
    _refuse_oversized(request, settings.max_artifact_bytes)
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
            body = ArtifactImport.model_validate_json(await _read_small_body(request))
        except ValidationError as exc:
            raise BadRequest("invalid push body: send multipart files or JSON {base, uri}",
                             detail={"errors": exc.errors(include_url=False,
                                                          include_context=False)}) from exc
        artifact, created = await run_in_threadpool(
            _push_uri, session, store, jobs, settings, namespace, body, principal.actor)
    if not created:
        response.status_code = status.HTTP_200_OK
    return artifact_out(artifact)


MULTIPART_OVERHEAD_BYTES = 64 * 1024
JSON_BODY_LIMIT_BYTES = 64 * 1024


async def _read_small_body(request: Request) -> bytes:
    """The JSON push body, refused (413 REQUEST_TOO_LARGE) past 64 KiB even if chunked."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > JSON_BODY_LIMIT_BYTES:
            raise RequestTooLarge("JSON push body too large",
                                  detail={"limit_bytes": JSON_BODY_LIMIT_BYTES})
        chunks.append(chunk)
    return b"".join(chunks)


def _refuse_oversized(request: Request, max_bytes: int) -> None:
    """413 before reading a body whose declared length cannot fit the limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes + MULTIPART_OVERHEAD_BYTES:
        raise ArtifactTooLarge(f"artifact exceeds {max_bytes} bytes",
                               detail={"limit_bytes": max_bytes,
                                       "content_length": int(declared)})


def _push_uri(session: Any, store: Any, jobs: Any, settings: Any, namespace: str,
              body: ArtifactImport, actor: str) -> tuple[Artifact, bool]:
    NamespaceRepository(session).get_by_name(namespace)  # 404s before any download
    BaseModelRepository(session).get_by_h_base(body.base)
    session.rollback()
    with import_prefix(body.uri, settings) as paths:
        handles = {name: path.open("rb") for name, path in paths.items()}
        try:
            return push_artifact(session, store, jobs, settings, namespace=namespace,
                                 h_base=body.base, files=handles, actor=actor, source=body.uri)
        finally:
            for handle in handles.values():
                handle.close()


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
