"""Request counts and latencies by method, route template and status (pure ASGI).

The route label is the matched route's template (`/v1/namespaces/{namespace}/aliases`),
never the raw path, and `unmatched` for a path no route serves, so a scanner cannot grow
the label set; methods outside the HTTP set are `OTHER`. The middleware sits outermost,
so the 401s of the auth gate, the 413s of the body limits and the 500s the request log
answers are counted with the route they were aimed at. Latency is until the app returned
(the last body byte sent): the desired-state and routing long-polls report their wait.
"""

from __future__ import annotations

import re
import time

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0)
"""Seconds; up to a minute so a long-poll (30 s by default) lands in a bucket."""


class HttpMetrics:
    """The API's request metrics, on the app's own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "adapterplane_api_requests", "HTTP requests answered by the admin API, by "
            "method, route template and status code.", ["method", "route", "status"],
            registry=registry)
        self.duration = Histogram(
            "adapterplane_api_request_duration_seconds", "Time from a request's arrival to "
            "its last response byte, by method and route template.", ["method", "route"],
            buckets=LATENCY_BUCKETS, registry=registry)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "OTHER"
        self.requests.labels(method, route, str(status)).inc()
        self.duration.labels(method, route).observe(seconds)


class RouteTemplates:
    """Path -> the template of the documented route it names, for requests the router did
    not hand to a route (the auth gate's 401, the body limits' 413, a mounted app's files).
    Built once, from the OpenAPI paths (the same table the 405 `Allow` header is read
    from, app.py); a path several templates match gets the one with the fewest parameters
    (a literal segment wins, as in route order). Under a mount: `<prefix>/{path}`."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._table: list[tuple[re.Pattern[str], str]] | None = None

    def _templates(self) -> list[tuple[re.Pattern[str], str]]:
        if self._table is None:
            paths: dict[str, object] = self.app.openapi()["paths"]
            ordered = sorted(paths, key=lambda t: t.count("{"))
            self._table = [(re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(t))), t)
                           for t in ordered]
        return self._table

    def template(self, scope: Scope) -> str:
        route = scope.get("route")  # set by the router when it matched a route
        path = getattr(route, "path", None)
        if isinstance(path, str):
            return path
        for pattern, template in self._templates():
            if pattern.fullmatch(scope["path"]):
                return template
        for mounted in self.app.routes:  # a mounted app (static files): its prefix
            if isinstance(mounted, Mount) and scope["path"].startswith(mounted.path + "/"):
                return f"{mounted.path}/{{path}}"
        return UNMATCHED


class HttpMetricsMiddleware:
    """Counts and times every HTTP request (see module doc)."""

    def __init__(self, app: ASGIApp, *, metrics: HttpMetrics, templates: RouteTemplates) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escaped with no response started

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.observe(scope["method"], self.templates.template(scope), status,
                                 time.perf_counter() - started)
