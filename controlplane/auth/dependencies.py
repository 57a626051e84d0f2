"""The authenticated caller of a request (401 without a valid token).

`CurrentPrincipal` authenticates on a pooled connection it returns at once, so routes
that then use a `Session` never hold two connections. The resolve route folds the
token check into its own statement instead (catalog/resolution.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controlplane.auth.scopes import Principal
from controlplane.auth.service import authenticate
from controlplane.errors import Unauthenticated
from controlplane.kit.deps import read_connection

bearer = HTTPBearer(auto_error=False, description="API token: `Authorization: Bearer ap_...`")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def bearer_plaintext(credentials: HTTPAuthorizationCredentials | None) -> str:
    """The token of an `Authorization: Bearer` header; 401 without one."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthenticated("missing bearer token")
    return credentials.credentials


def current_principal(request: Request, credentials: Credentials) -> Principal:
    token = bearer_plaintext(credentials)
    with read_connection(request.app.state.engine) as conn:
        return authenticate(conn, token)


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
