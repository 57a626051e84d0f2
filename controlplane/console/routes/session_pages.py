"""/ui, /ui/login, /ui/logout: a session is the pasted API token in a cookie."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse

from controlplane.auth.dependencies import authenticate_token
from controlplane.console.rendering import render
from controlplane.console.route import ConsoleRoute
from controlplane.console.session import (
    CONSOLE_PREFIX,
    ConsolePrincipal,
    clear_session_cookie,
    new_login_csrf,
    require_csrf,
    require_login_csrf,
    set_login_csrf_cookie,
    set_session_cookie,
)
from controlplane.errors import Unauthenticated

router = APIRouter(prefix=CONSOLE_PREFIX, route_class=ConsoleRoute, include_in_schema=False)
HOME = f"{CONSOLE_PREFIX}/namespaces"


def safe_next(target: str | None) -> str:
    """Where to go after login: a console path only (no open redirect)."""
    if target and target.startswith(CONSOLE_PREFIX + "/") and not target.startswith("//") \
            and "\\" not in target and not target.startswith(f"{CONSOLE_PREFIX}/login"):
        return target
    return HOME


@router.get("")
def home() -> RedirectResponse:
    return RedirectResponse(HOME, status_code=303)


def _login_form(request: Request, next_path: str, *, error: str | None = None,
                status_code: int = 200) -> Response:
    value = new_login_csrf()
    response = render(request, "login.html", {"login_csrf": value, "next": next_path,
                                              "error": error}, status_code=status_code)
    set_login_csrf_cookie(request, response, value)
    return response


@router.get("/login")
def login_page(request: Request,
               next: Annotated[str | None, Query(max_length=2000)] = None) -> Response:
    return _login_form(request, safe_next(next))


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the pasted token exactly as the API does; on success hold it in the cookie."""
    form = await request.form(max_files=0, max_fields=5)
    require_login_csrf(request, form.get("csrf"))
    token = form.get("token")
    submitted_next = form.get("next")
    next_path = safe_next(submitted_next if isinstance(submitted_next, str) else None)
    if not isinstance(token, str) or not token.strip():
        return _login_form(request, next_path, error="Paste an API token.", status_code=422)
    try:
        await run_in_threadpool(authenticate_token, request.app.state.read_engine,
                                token.strip())
    except Unauthenticated as exc:
        return _login_form(request, next_path, error=f"{exc.message} ({exc.code})",
                           status_code=401)
    response = RedirectResponse(next_path, status_code=303)
    set_session_cookie(request, response, token.strip())
    return response


@router.post("/logout")
async def logout(request: Request, principal: ConsolePrincipal) -> Response:
    form = await request.form(max_files=0, max_fields=5)
    require_csrf(request, form.get("csrf"))
    response = RedirectResponse(f"{CONSOLE_PREFIX}/login", status_code=303)
    clear_session_cookie(response)
    return response

