"""Jinja2 templates of the console, the filters they use, and the HTML error page.

Autoescaping is on for every template (FastAPI's `Jinja2Templates` default for `.html`),
so values from the registry (reasons, rejection messages, actor names) are text, never
markup. Every page gets the session's principal and CSRF token when there is one.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from controlplane.errors import AdapterplaneError

PACKAGE_DIR = Path(__file__).parent
templates = Jinja2Templates(directory=PACKAGE_DIR / "templates")

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""On every console page: no framing (the confirmation pages are not clickjackable), no
inline script or style, nothing cached (pages show a token's view of the registry)."""


def when(value: datetime | float | None) -> str:
    """`2026-01-02 03:04:05 UTC` (timestamps are stored naive UTC or as epoch seconds)."""
    if value is None:
        return "—"
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def byte_size(value: int | None) -> str:
    """Bytes as `12 345 B (12.1 KiB)`: the exact count and a readable unit."""
    if value is None:
        return "—"
    size, unit = float(value), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    exact = f"{value:,} B".replace(",", " ")
    return exact if unit == "B" else f"{exact} ({size:.1f} {unit})"


def short_digest(value: str | None) -> str:
    return "—" if not value else value[:12]


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


templates.env.filters.update(when=when, byte_size=byte_size, short_digest=short_digest,
                             as_json=as_json)


def render(request: Request, name: str, context: dict[str, Any] | None = None,
           *, status_code: int = 200) -> HTMLResponse:
    page = {"principal": getattr(request.state, "console_principal", None),
            "csrf": getattr(request.state, "console_csrf", None), **(context or {})}
    response = templates.TemplateResponse(request, name, page, status_code=status_code)
    response.headers.update(SECURITY_HEADERS)
    return response


def error_page(request: Request, exc: AdapterplaneError) -> HTMLResponse:
    """The error as a page: its stable code, message and status (never a stack trace)."""
    return render(request, "error.html", {"error": exc}, status_code=exc.status_code)
