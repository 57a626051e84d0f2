"""The authenticated caller of a request (401 without a valid token).

`CurrentPrincipal` authenticates on a pooled connection it returns at once, so routes
that then use a `Session` never hold two connections. A request that may carry a body
was already authenticated by the gate (auth/gate.py) before its body was read; its
principal is reused here. The resolve route folds the token check into its own
statement instead (catalog/resolution.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy import Engine

from controlplane.auth.scopes import Principal
from controlplane.auth.service import authenticate
from controlplane.errors import Unauthenticated
from controlplane.kit.deps import run_read

bearer = HTTPBearer(auto_error=False, description="API token: `Authorization: Bearer ap_...`")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
PRINCIPAL_STATE = "principal"
"""Key of the gate's authenticated `Principal` in the request's `scope["state"]`."""


def bearer_plaintext(credentials: HTTPAuthorizationCredentials | None) -> str:
    """The token of an `Authorization: Bearer` header; 401 without one."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthenticated("missing bearer token")
    return credentials.credentials


def bearer_from_header(authorization: str | None) -> str:
    """`bearer_plaintext` of a raw `Authorization` header value (as HTTPBearer parses it)."""
    scheme, token = get_authorization_scheme_param(authorization)
    if not (authorization and scheme and token):
        return bearer_plaintext(None)
    return bearer_plaintext(HTTPAuthorizationCredentials(scheme=scheme, credentials=token))


def authenticate_token(engine: Engine, token: str) -> Principal:
    return run_read(engine, lambda conn: authenticate(conn, token))


def current_principal(request: Request, credentials: Credentials) -> Principal:
    known = getattr(request.state, PRINCIPAL_STATE, None)
    if isinstance(known, Principal):
        return known
    return authenticate_token(request.app.state.read_engine, bearer_plaintext(credentials))


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
