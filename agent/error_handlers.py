"""The error handlers the agent's and the router's FastAPI apps share: every refusal is
OpenAI's error object (agent/openai_errors.py)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent.auth_gate import control_plane_unavailable
from agent.catalog import ServingError
from agent.openai_errors import error_body, error_response
from agent.sync import ControlPlaneError


def install_error_handlers(app: FastAPI, retry_after_s: int) -> None:
    @app.exception_handler(ServingError)
    async def _serving(_r: Request, exc: ServingError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        # the framework's own refusals in the one error object: an unparseable body is
        # invalid input like any other (422), an unknown route 404, a wrong method 405
        status = 422 if exc.status_code == 400 else exc.status_code
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 422: "VALIDATION_ERROR"}.get(
            status, f"HTTP_{status}")
        return JSONResponse(error_body(status, code, str(exc.detail)), status_code=status,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(ControlPlaneError)
    async def _control_plane(_r: Request, _exc: ControlPlaneError) -> JSONResponse:
        # a permission the control plane could not answer (and no recent cached answer)
        return control_plane_unavailable(retry_after_s)
