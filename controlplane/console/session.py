"""Console sessions: the API token itself, held in an HttpOnly, SameSite=Strict cookie.

There is no second auth system. Every console request authenticates the cookie's token
with the API's own lookup (`controlplane.auth.dependencies.authenticate_token`, one
indexed SELECT, no cache), so a revoked token stops working on the next click and a
read-only token holds exactly the API's read scope.

CSRF: every mutating form carries `csrf`, an HMAC of a fixed label keyed by the session
token. A cross-site page can neither read the cookie nor compute the HMAC, so a forged
POST is refused (403 CSRF_REJECTED) before anything is parsed beyond the form. The
login form, which has no session yet, is protected by a double-submit value: a random
token set as its own cookie when the form is rendered and echoed in the form.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated

from fastapi import Depends, Request, Response

from controlplane.auth.dependencies import authenticate_token
from controlplane.auth.scopes import Principal
from controlplane.console.errors import CsrfRejected
from controlplane.errors import Unauthenticated

CONSOLE_PREFIX = "/ui"
SESSION_COOKIE = "adapterplane_console"
LOGIN_CSRF_COOKIE = "adapterplane_console_login"
CSRF_LABEL = b"adapterplane-console-csrf"
SESSION_MAX_AGE_S = 8 * 3600
"""The browser forgets the cookie after a working day; the token itself is unchanged."""


def session_token(request: Request) -> str:
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise Unauthenticated("not logged in to the console")
    return token


def console_principal(request: Request) -> Principal:
    """The principal of the session cookie (401 UNAUTHENTICATED without a valid one)."""
    token = session_token(request)
    principal = authenticate_token(request.app.state.read_engine, token)
    request.state.console_principal = principal
    request.state.console_csrf = csrf_for(token)
    return principal


ConsolePrincipal = Annotated[Principal, Depends(console_principal)]


def csrf_for(token: str) -> str:
    return hmac.new(token.encode(), CSRF_LABEL, hashlib.sha256).hexdigest()


def require_csrf(request: Request, submitted: object) -> None:
    """Refuse a form whose `csrf` field is not this session's token."""
    expected = csrf_for(session_token(request))
    if not (isinstance(submitted, str) and hmac.compare_digest(submitted, expected)):
        raise CsrfRejected("the form's CSRF token is missing or wrong; reload the page",
                           detail={"field": "csrf"})


def new_login_csrf() -> str:
    return secrets.token_urlsafe(24)


def require_login_csrf(request: Request, submitted: object) -> None:
    expected = request.cookies.get(LOGIN_CSRF_COOKIE) or ""
    if not (expected and isinstance(submitted, str)
            and hmac.compare_digest(submitted, expected)):
        raise CsrfRejected("the login form expired or was not sent by this console; "
                           "reload it", detail={"field": "csrf"})


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_session_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(SESSION_COOKIE, token, max_age=SESSION_MAX_AGE_S,
                        path=CONSOLE_PREFIX, httponly=True, samesite="strict",
                        secure=_secure(request))
    response.delete_cookie(LOGIN_CSRF_COOKIE, path=CONSOLE_PREFIX)


def set_login_csrf_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(LOGIN_CSRF_COOKIE, value, path=CONSOLE_PREFIX, httponly=True,
                        samesite="strict", secure=_secure(request))


def clear_session_cookie(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path=CONSOLE_PREFIX, httponly=True,
                           samesite="strict")
