"""`create_app(settings)`: the admin REST API (FastAPI).

Resources on `app.state`: settings, engine, session factory, object store, Celery app,
job queue. One error body everywhere: `{"error", "code", "detail"}` (see errors.py; an
unhandled exception becomes 500 INTERNAL_ERROR in kit/request_log.py). Every request
is logged as one structlog JSON line with its `X-Request-ID`.

Middleware, outermost first: the request metrics (metrics/, served at `GET /metrics`);
the request log; the auth gate (401 before a body is read, auth/gate.py); the body limits
(kit/body_limit.py). An unreachable database is a retryable 503 DATABASE_UNAVAILABLE with
`Retry-After`, wherever it surfaces.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from controlplane.agents.endpoints import router as agents_router
from controlplane.artifacts.endpoints import router as artifacts_router
from controlplane.audit.endpoints import router as audit_router
from controlplane.auth.endpoints import router as tokens_router
from controlplane.auth.gate import AuthGateMiddleware
from controlplane.bases.endpoints import router as bases_router
from controlplane.catalog.endpoints import router as catalog_router
from controlplane.collections.endpoints import router as collections_router
from controlplane.config import Settings
from controlplane.console import CONSOLE_PREFIX, install_console
from controlplane.db import make_engine, make_session_factory
from controlplane.errors import ERROR_RESPONSES, AdapterplaneError, ErrorBody
from controlplane.fleet.endpoints import router as fleet_router
from controlplane.health.endpoints import router as health_router
from controlplane.kit.async_reads import AsyncReads
from controlplane.kit.body_limit import BodyLimitMiddleware
from controlplane.kit.deps import make_read_engine
from controlplane.kit.failures import (
    DATABASE_DOWN,
    database_unavailable,
    domain_error_response,
    error_response,
)
from controlplane.kit.request_log import RequestLogMiddleware, configure_logging
from controlplane.kit.strict_query import strict_query
from controlplane.merges.endpoints import lineage_router as merge_lineage_router
from controlplane.merges.endpoints import router as merges_router
from controlplane.metrics.endpoint import install_metrics
from controlplane.namespaces.endpoints import router as namespaces_router
from controlplane.retention.endpoints import router as retention_router
from controlplane.storage import StorageError, store_from_settings
from controlplane.worker.celery_app import make_celery
from controlplane.worker.context import dispose_worker_context
from controlplane.worker.jobs import JobQueue
from controlplane.worker.scratch import (
    remove_own_scratch,
    remove_stale_scratch,
    use_process_scratch,
)

HTTP_CODES = {401: "UNAUTHENTICATED", 403: "FORBIDDEN", 404: "NOT_FOUND",
              405: "METHOD_NOT_ALLOWED", 413: "ARTIFACT_TOO_LARGE", 415: "UNSUPPORTED_MEDIA_TYPE"}
"""Codes of the framework's own HTTP errors. Its 400 (a body it cannot parse: malformed
multipart, undecodable bytes) is answered as 422 VALIDATION_ERROR, like malformed JSON."""
UPLOAD_PATH = re.compile(r"/v1/namespaces/[^/]+/artifacts/?")
"""The one route whose body is streamed (artifact push), not buffered."""
MULTIPART_OVERHEAD_BYTES = 64 * 1024
"""Multipart framing (boundaries, part headers, the `base` field) on top of the files."""


def create_server_app() -> FastAPI:
    """The app of an API server process (`adapterplane api`, one per uvicorn worker):
    environment settings, and temp files (uploads being hashed, imports) under this
    process's own scratch root, so a killed API process leaves nothing the next start
    does not remove (controlplane/worker/scratch.py)."""
    return create_app(process_scratch=True)


def create_app(settings: Settings | None = None, *, process_scratch: bool = False) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if process_scratch:
            remove_stale_scratch()
            use_process_scratch()
        try:
            yield
        finally:
            if app.state.async_reads is not None:
                await app.state.async_reads.close()
            close_app_resources(app)
            if process_scratch:
                remove_own_scratch()

    app = FastAPI(
        lifespan=lifespan,
        title="Adapterplane admin API",
        version="1",
        description="Registry of content-addressed LoRA artifacts and append-only alias "
                    "generations. Every route but /healthz and /readyz needs a bearer token.",
    )
    engine = make_engine(settings.database_url, pool_size=settings.database_pool_size)
    celery = make_celery(settings)
    app.state.settings = settings
    app.state.engine = engine
    app.state.read_engine = make_read_engine(engine, pool_size=settings.database_pool_size)
    app.state.async_reads = None if engine.dialect.name == "sqlite" else AsyncReads(
        engine.url, settings.database_pool_size)
    app.state.session_factory = make_session_factory(engine)
    app.state.store = store_from_settings(settings)
    app.state.celery = celery
    app.state.jobs = JobQueue(celery, settings.celery_queue)

    configure_logging(settings.log_level)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_json_body_bytes,
                       max_upload_bytes=settings.max_artifact_bytes + MULTIPART_OVERHEAD_BYTES,
                       upload_path=UPLOAD_PATH)
    app.add_middleware(AuthGateMiddleware, self_authenticated_prefix=CONSOLE_PREFIX)
    app.add_middleware(RequestLogMiddleware)
    install_metrics(app)  # outermost: GET /metrics, and every answer counted
    app.include_router(health_router)
    # the catalog first: routes are matched in order, and resolve is the hot path
    for router in (catalog_router, bases_router, namespaces_router, artifacts_router,
                   collections_router, audit_router, tokens_router, agents_router,
                   fleet_router, retention_router, merges_router, merge_lineage_router):
        app.include_router(router, responses=ERROR_RESPONSES,
                           dependencies=[Depends(strict_query)])
    install_console(app)  # the web console at /ui (controlplane/console)
    _install_error_handlers(app)
    return app


def close_app_resources(app: FastAPI) -> None:
    """Close the app's Celery connections and both database pools."""
    dispose_worker_context(app.state.celery)
    app.state.engine.dispose()
    app.state.read_engine.dispose()


def _validation_message(errors: list[Any]) -> str:
    """`invalid request: <where>: <why>` of the first error (`+ N more`), so a client
    that prints only the message (adapterctl) still says what was wrong."""
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"invalid request: {where + ': ' if where else ''}{first.get('msg', '')}{more}"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AdapterplaneError)
    async def _domain(_request: Request, exc: AdapterplaneError) -> JSONResponse:
        return domain_error_response(exc)

    async def _database_down(_request: Request, exc: Exception) -> JSONResponse:
        return domain_error_response(database_unavailable(exc))

    for down in DATABASE_DOWN:
        app.add_exception_handler(down, _database_down)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors: list[Any] = [
            {k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()
        ]
        return error_response(422, ErrorBody(error=_validation_message(errors),
                                             code="VALIDATION_ERROR",
                                             detail={"errors": jsonable_encoder(errors)}))

    @app.exception_handler(DataError)
    async def _data(_request: Request, exc: DataError) -> JSONResponse:
        # The database refused a value the schema let through (a NUL character in a
        # string, an integer out of BIGINT range): the caller's input, not our fault.
        # Only the driver's first line is echoed, never the SQL or its parameters.
        reason = str(exc.orig).splitlines()[0] if exc.orig is not None else "invalid value"
        return error_response(422, ErrorBody(error="a value in the request cannot be stored",
                                             code="VALIDATION_ERROR", detail={"reason": reason}))

    @app.exception_handler(StorageError)
    async def _storage(_request: Request, exc: StorageError) -> JSONResponse:
        return error_response(502, ErrorBody(error=f"object storage failed: {exc}",
                                             code="STORAGE_ERROR", detail={}))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        if exc.status_code == 400:
            return error_response(422, ErrorBody(error=f"invalid request: {exc.detail}",
                                                 code="VALIDATION_ERROR", detail={}), headers)
        code = HTTP_CODES.get(exc.status_code, f"HTTP_{exc.status_code}")
        return error_response(exc.status_code,
                              ErrorBody(error=str(exc.detail), code=code, detail={}), headers)


def _allowed_methods(request: Request) -> str:
    """Every method the API documents at this path (the router's own `Allow` names only
    those of the first route whose path matched)."""
    path = request.scope["path"]
    methods: set[str] = set()
    for template, operations in request.app.openapi()["paths"].items():
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path):
            methods |= {method.upper() for method in operations}
    return ", ".join(sorted(methods))
