"""/v1/namespaces/{ns}/merges: submit a merged release (publish scope), list and get (read
scope); /v1/bases/{h_base}/lineage: the releases that produced a base (those in
namespaces the caller may read)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Query, Response, status

from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.bases.repository import BaseModelRepository
from controlplane.kit.deps import JobsDep, SessionDep, SettingsDep
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.merges.convert import merge_out
from controlplane.merges.repository import MergeRepository
from controlplane.merges.schemas import LineageOut, MergeCreate, MergeOut
from controlplane.merges.service import submit_merge
from controlplane.models import Merge
from controlplane.namespaces.repository import NamespaceRepository

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
