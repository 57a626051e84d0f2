"""/v1/bases: register (admin on '*'), list and get (any token)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response, status

from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.bases.repository import BaseModelRepository
from controlplane.bases.schemas import BaseCreate, BaseOut
from controlplane.bases.service import register_base
from controlplane.kit.deps import SessionDep
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.models import BaseModel

router = APIRouter(prefix="/v1/bases", tags=["bases"])


def base_out(base: BaseModel) -> BaseOut:
    return BaseOut(id=base.id, name=base.name, h_base=base.h_base,
                   architecture=base.architecture, abi=base.abi, created_at=base.created_at)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=BaseOut,
             responses={200: {"model": BaseOut, "description": "Already registered."}})
def create_base(body: BaseCreate, principal: CurrentPrincipal, session: SessionDep,
                response: Response) -> BaseOut:
    principal.require_global(Role.ADMIN)
    base, created = register_base(session, name=body.name, abi=body.abi, actor=principal.actor)
    if not created:
        response.status_code = status.HTTP_200_OK
    return base_out(base)


@router.get("", response_model=PageOut[BaseOut])
def list_bases(principal: CurrentPrincipal, session: SessionDep,
               params: Annotated[PageParams, Depends(page_params)]) -> dict[str, Any]:
    repo = BaseModelRepository(session)
    page = repo.paginate(repo.select(), key=BaseModel.id, params=params)
    return page_out(page, base_out)


@router.get("/{h_base}", response_model=BaseOut)
def get_base(h_base: str, principal: CurrentPrincipal, session: SessionDep) -> BaseOut:
    return base_out(BaseModelRepository(session).get_by_h_base(h_base))
