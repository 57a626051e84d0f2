"""/v1/namespaces/{ns}/merges: submit a merged release (publish scope), list and get (read
scope); /v1/bases/{h_base}/lineage: the releases that produced a base (those in
namespaces the caller may read); /v1/bases/{h_base}/checkpoint: download URLs of a merged
base's files (what an agent serving the release fetches)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Query, Response, status

from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.bases.repository import BaseModelRepository
from controlplane.contracts import BaseCheckpoint, DesiredFile
from controlplane.errors import NotFound
from controlplane.kit.deps import JobsDep, SessionDep, SettingsDep, StoreDep
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.merges.convert import merge_out
from controlplane.merges.repository import MergeRepository
from controlplane.merges.schemas import LineageOut, MergeCreate, MergeOut
from controlplane.merges.service import submit_merge
from controlplane.models import Merge
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage.urls import URL_TTL_S, object_url

router = APIRouter(prefix="/v1/namespaces/{namespace}/merges", tags=["merges"])
lineage_router = APIRouter(prefix="/v1/bases", tags=["merges"])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=MergeOut,
             responses={200: {"model": MergeOut,
                              "description": "The same request was already submitted."}})
def submit(namespace: str, body: MergeCreate, principal: CurrentPrincipal,
           session: SessionDep, jobs: JobsDep, settings: SettingsDep,
           response: Response) -> MergeOut:
    """Merge the listed validated adapters, in order, into their base; runs on a worker."""
    principal.require(namespace, Role.PUBLISH)
    merge, created = submit_merge(session, jobs, settings, namespace=namespace, body=body,
                                  actor=principal.actor)
    if not created:
        response.status_code = status.HTTP_200_OK
    return merge_out(merge)


@router.get("", response_model=PageOut[MergeOut])
def list_merges(
    namespace: str, principal: CurrentPrincipal, session: SessionDep,
    params: Annotated[PageParams, Depends(page_params)],
    state: Annotated[Literal["pending", "merging", "merged", "rejected"] | None,
                     Query()] = None,
) -> dict[str, Any]:
    """Newest first."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    repo = MergeRepository(session)
    page = repo.paginate(repo.in_namespace(ns.id, state), key=cast(Any, Merge.id),
                         params=params, descending=True)
    return page_out(page, merge_out)


@router.get("/{ref}", response_model=MergeOut)
def get_merge(namespace: str, ref: str, principal: CurrentPrincipal,
              session: SessionDep) -> MergeOut:
    """`ref`: merge id or `sha256:<H_merged>`."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    return merge_out(MergeRepository(session).get_by_ref(ns.id, ref))


@lineage_router.get("/{h_base}/lineage", response_model=LineageOut)
def get_lineage(h_base: str, principal: CurrentPrincipal, session: SessionDep) -> LineageOut:
    """Empty `merges` for a base registered from a checkpoint (or released in namespaces
    the caller cannot read)."""
    base = BaseModelRepository(session).get_by_h_base(h_base)
    merges = [m for m in MergeRepository(session).producing(base.id)
              if principal.can(m.namespace.name, Role.READ)]
    return LineageOut(h_base=base.h_base, merges=[merge_out(m) for m in merges])


@lineage_router.get("/{h_base}/checkpoint", response_model=BaseCheckpoint)
def get_checkpoint(h_base: str, principal: CurrentPrincipal, session: SessionDep,
                   store: StoreDep) -> BaseCheckpoint:
    """The files of the oldest merged release (in a namespace the caller may read; agent
    tokens read every namespace) that produced base `h_base`; 404 for a base registered
    from a checkpoint the registry does not hold."""
    base = BaseModelRepository(session).get_by_h_base(h_base)
    merge = next((m for m in MergeRepository(session).producing(base.id)
                  if principal.can(m.namespace.name, Role.READ)), None)
    if merge is None or merge.files is None or merge.digest is None:
        raise NotFound(f"the registry holds no checkpoint of base {h_base}",
                       detail={"kind": "checkpoint", "ref": h_base})
    files = {name: DesiredFile(sha256=str(f["sha256"]), size=int(f["size"]),
                               url=object_url(store, str(f["key"])))
             for name, f in sorted(merge.files.items())}
    return BaseCheckpoint(h_base=base.h_base, merge_id=merge.id, h_merged=merge.digest,
                         files=files, url_ttl_s=URL_TTL_S)
