"""POST /v1/tokens (admin on '*'), DELETE /v1/tokens/{id}."""

from __future__ import annotations

from fastapi import APIRouter, status

from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.schemas import GrantIn, TokenCreate, TokenCreated, TokenOut
from controlplane.auth.scopes import Grant, Role
from controlplane.auth.service import issue_token, revoke_token
from controlplane.db import begin_write
from controlplane.kit.deps import SessionDep

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TokenCreated)
def create_token(body: TokenCreate, principal: CurrentPrincipal,
                 session: SessionDep) -> TokenCreated:
    principal.require_global(Role.ADMIN)
    begin_write(session)
    grants = [Grant(g.namespace, g.role) for g in body.grants]
    token, plaintext = issue_token(session, name=body.name, grants=grants,
                                   is_agent=body.is_agent, actor=principal.actor)
    session.commit()
    return TokenCreated(id=token.id, name=token.name, token=plaintext, grants=body.grants,
                        is_agent=token.is_agent)


@router.delete("/{token_id}", response_model=TokenOut)
def delete_token(token_id: int, principal: CurrentPrincipal, session: SessionDep) -> TokenOut:
    """Revoke a token (kept for audit; it can no longer authenticate)."""
    principal.require_global(Role.ADMIN)
    token = revoke_token(session, token_id, actor=principal.actor)
    return TokenOut(id=token.id, name=token.name,
                    grants=[GrantIn.model_validate(g) for g in token.grants],
                    is_agent=token.is_agent, revoked=token.revoked, created_at=token.created_at)
