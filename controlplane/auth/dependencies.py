"""`CurrentPrincipal`: the authenticated caller of a request (401 without a valid token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controlplane.auth.scopes import Principal
from controlplane.auth.service import authenticate
from controlplane.errors import Unauthenticated
from controlplane.kit.deps import SessionDep

bearer = HTTPBearer(auto_error=False, description="API token: `Authorization: Bearer ap_...`")


def current_principal(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthenticated("missing bearer token")
    principal = authenticate(session, credentials.credentials)
    session.rollback()  # end the read transaction; handlers start their own
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
