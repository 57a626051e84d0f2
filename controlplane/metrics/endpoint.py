"""`install_metrics(app)`: the request metrics middleware, the registry gauges and
`GET /metrics` (Prometheus text format) on one app.

Each app has its own registry (tests build several apps in one interpreter). Under
`adapterplane api --workers N` every worker process counts its own requests and a scrape
reads the one that answers it, so run one worker per process that Prometheus scrapes
(the Kubernetes manifests and the systemd unit do); the row-derived gauges are the same
whichever process answers. `/metrics` is not in the OpenAPI document (it is not part of
the REST contract) and needs no token, like the agents' and routers' (see
controlplane/metrics/__init__.py).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from controlplane.metrics.http import HttpMetrics, HttpMetricsMiddleware, RouteTemplates
from controlplane.metrics.registry_gauges import RegistryCollector


def install_metrics(app: FastAPI) -> None:
    """Call after the other middleware is added, so this one is outermost and counts the
    answers they give too."""
    registry = CollectorRegistry()
    registry.register(RegistryCollector(app.state.session_factory))
    app.state.metrics_registry = registry
    app.add_middleware(HttpMetricsMiddleware, metrics=HttpMetrics(registry),
                       templates=RouteTemplates(app))

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        return Response(generate_latest(request.app.state.metrics_registry),
                        media_type=CONTENT_TYPE_LATEST)
