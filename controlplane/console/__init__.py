"""The web console: server-rendered pages of the registry at `/ui` (docs/CONSOLE.md).

Pages are Jinja2 templates filled in-process from the control plane's repositories and
services; htmx (vendored in static/) refreshes the agents' live numbers. Sessions are
API tokens (session.py): the same lookup, the same scopes, no second auth system. The
API's auth gate leaves `/ui` to the console, which authenticates its session cookie
before it reads a form.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from controlplane.console.rendering import PACKAGE_DIR
from controlplane.console.routes import (
    audit_pages,
    catalog_pages,
    fleet_pages,
    registry_pages,
    session_pages,
)
from controlplane.console.session import CONSOLE_PREFIX
from controlplane.console.views.agents import ScrapeHistory

__all__ = ["CONSOLE_PREFIX", "install_console"]


def install_console(app: FastAPI) -> None:
    """Mount the console's routes and static files on the API app."""
    app.state.console_scrapes = ScrapeHistory()
    for module in (session_pages, catalog_pages, registry_pages, fleet_pages, audit_pages):
        app.include_router(module.router)
    app.mount(f"{CONSOLE_PREFIX}/static", StaticFiles(directory=PACKAGE_DIR / "static"),
              name="console-static")
