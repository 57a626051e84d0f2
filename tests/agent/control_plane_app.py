"""uvicorn factory for the tests' control plane: `create_app` plus the agent routes.

Until `controlplane/app.py` includes the agents router itself this adds it; once it
does, the router is not added twice.
"""

from __future__ import annotations

from fastapi import FastAPI

from controlplane.agents.endpoints import router as agents_router
from controlplane.app import create_app
from controlplane.config import Settings
from controlplane.errors import ERROR_RESPONSES


def create_app_with_agents() -> FastAPI:
    app = create_app(Settings())
    paths = {getattr(r, "path", "") for r in app.router.routes}
    if "/v1/agents/register" not in paths:
        app.include_router(agents_router, responses=ERROR_RESPONSES)
    return app
