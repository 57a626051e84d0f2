"""/v1/namespaces/{ns}/collections: submit a fit and materialize members (publish scope),
list and get (read scope)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Query, Response, status
from starlette.concurrency import run_in_threadpool

from controlplane.artifacts.convert import artifact_out
from controlplane.artifacts.schemas import ArtifactOut
from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.collections.convert import collection_out
from controlplane.collections.members import materialize_member
from controlplane.collections.repository import CollectionRepository
from controlplane.collections.schemas import BundleFile, BundleOut, CollectionCreate, CollectionOut
from controlplane.collections.service import submit_collection
from controlplane.errors import InvalidState
from controlplane.kit.deps import JobsDep, SessionDep, SettingsDep, StoreDep
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.models import Collection, CollectionState
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage.urls import URL_TTL_S, object_url

router = APIRouter(prefix="/v1/namespaces/{namespace}/collections", tags=["collections"])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=CollectionOut,
             responses={200: {"model": CollectionOut,
                              "description": "The same request was already submitted."}})
def submit(namespace: str, body: CollectionCreate, principal: CurrentPrincipal,
           session: SessionDep, jobs: JobsDep, response: Response) -> CollectionOut:
    """Fit shared bases for the listed validated artifacts; the fit runs on a worker."""
    principal.require(namespace, Role.PUBLISH)
    collection, created = submit_collection(session, jobs, namespace=namespace, body=body,
                                            actor=principal.actor)
    if not created:
        response.status_code = status.HTTP_200_OK
    return collection_out(collection)


@router.get("", response_model=PageOut[CollectionOut])
def list_collections(
    namespace: str, principal: CurrentPrincipal, session: SessionDep,
    params: Annotated[PageParams, Depends(page_params)],
    state: Annotated[Literal["pending", "fitting", "fitted", "rejected"] | None,
                     Query()] = None,
) -> dict[str, Any]:
    """Newest first."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    repo = CollectionRepository(session)
    page = repo.paginate(repo.in_namespace(ns.id, state), key=cast(Any, Collection.id),
                         params=params, descending=True)
    return page_out(page, collection_out)


@router.get("/{ref}", response_model=CollectionOut)
def get_collection(namespace: str, ref: str, principal: CurrentPrincipal,
                   session: SessionDep) -> CollectionOut:
    """`ref`: collection id or `sha256:<H_collection>`."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    return collection_out(CollectionRepository(session).get_by_ref(ns.id, ref))


@router.get("/{ref}/bundle", response_model=BundleOut)
def get_bundle(namespace: str, ref: str, principal: CurrentPrincipal, session: SessionDep,
               store: StoreDep) -> BundleOut:
    """Read URLs of a fitted collection's bundle files (409 unless fitted)."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    collection = CollectionRepository(session).get_by_ref(ns.id, ref)
    if collection.state != CollectionState.FITTED.value or collection.digest is None:
        raise InvalidState(f"collection {ref} is {collection.state}, not fitted",
                           detail={"collection": ref, "state": collection.state})
    files = {name: BundleFile(sha256=f["sha256"], size=f["size"],
                              url=object_url(store, str(f["key"])))
             for name, f in (collection.files or {}).items()}
    return BundleOut(digest=collection.digest, files=files, url_ttl_s=URL_TTL_S)


@router.post("/{ref}/members/{index}/artifact", status_code=status.HTTP_202_ACCEPTED,
             response_model=ArtifactOut,
             responses={200: {"model": ArtifactOut,
                              "description": "This member was already pushed here."}})
async def push_member(namespace: str, ref: str, index: int, principal: CurrentPrincipal,
                      session: SessionDep, store: StoreDep, jobs: JobsDep,
                      settings: SettingsDep, response: Response,
                      dtype: Annotated[Literal["float32", "float16", "bfloat16"],
                                       Query()] = "float32") -> ArtifactOut:
    """Push member `index` of a fitted collection as a rank-R PEFT artifact (then validated,
    published and served like any adapter)."""
    principal.require(namespace, Role.PUBLISH)
    artifact, created = await run_in_threadpool(
        materialize_member, session, store, jobs, settings, namespace=namespace, ref=ref,
        index=index, dtype=dtype, actor=principal.actor)
    if not created:
        response.status_code = status.HTTP_200_OK
    return artifact_out(artifact)
