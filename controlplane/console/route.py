"""`ConsoleRoute`: every console route answers errors as HTML pages, never JSON.

The API's handlers (controlplane/app.py) answer `AdapterplaneError` with the JSON error
body; a browser should see a page instead. This route class catches what a console
handler raises: a missing or revoked session on a GET redirects to the login page
(coming back afterwards); every other error renders `error.html` with its status and
stable code (a path or query value of the wrong type is 422 VALIDATION_ERROR); an
unreachable database is the API's 503 DATABASE_UNAVAILABLE as a page.
Every response gets the console's security headers.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import quote

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from fastapi.routing import APIRoute

from controlplane.console.rendering import SECURITY_HEADERS, error_page
from controlplane.console.session import CONSOLE_PREFIX
from controlplane.errors import AdapterplaneError, BadRequest, Unauthenticated
from controlplane.kit.failures import DATABASE_DOWN, database_unavailable

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def invalid_request(exc: RequestValidationError) -> BadRequest:
    """A path or query value the route's types refuse, as the API's 422 VALIDATION_ERROR."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    where = ".".join(str(part) for part in first.get("loc", ()))
    return BadRequest(f"invalid request: {where}: {first.get('msg', '')}",
                      detail={"field": where})


def login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{CONSOLE_PREFIX}/login?next={quote(target, safe='')}",
                            status_code=303)


class ConsoleRoute(APIRoute):
    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()

        async def console_handler(request: Request) -> Response:
            try:
                response = await handle(request)
            except Unauthenticated as exc:
                if request.method in ("GET", "HEAD"):
                    response = login_redirect(request)
                else:
                    response = error_page(request, exc)
            except AdapterplaneError as exc:
                response = error_page(request, exc)
            except RequestValidationError as exc:
                response = error_page(request, invalid_request(exc))
            except DATABASE_DOWN as exc:
                response = error_page(request, database_unavailable(exc))
            response.headers.update(SECURITY_HEADERS)
            return response

        return console_handler
