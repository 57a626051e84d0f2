"""Refuse query parameters a route does not take, or takes once but was given twice.

No API route takes a list in its query string, and a framework that ignores
`?limt=5` or keeps the last of `?cursor=a&cursor=b` answers for an input the client did
not mean. Each route's parameters are the ones its OpenAPI operation documents (read
once per app); anything else is 422 VALIDATION_ERROR naming the parameter, before the
route runs.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError


def strict_query(request: Request) -> None:
    """A router dependency (`include_router(..., dependencies=[Depends(strict_query)])`)."""
    query = request.query_params
    if not query:
        return
    route = request.scope.get("route")
    allowed = _documented(request.app).get((request.method, getattr(route, "path", "")))
    if allowed is None:
        return
    seen: set[str] = set()
    for key, _ in query.multi_items():
        why = ("given more than once" if key in seen
               else None if key in allowed else "not a parameter of this operation")
        if why is not None:
            raise RequestValidationError([{"loc": ("query", key), "msg": why,
                                           "type": "unexpected_parameter"}])
        seen.add(key)


def _documented(app: FastAPI) -> dict[tuple[str, str], frozenset[str]]:
    known: dict[tuple[str, str], frozenset[str]] | None = getattr(
        app.state, "query_parameters", None)
    if known is None:
        known = {}
        paths: dict[str, Any] = app.openapi().get("paths", {})
        for path, operations in paths.items():
            for method, operation in operations.items():
                if isinstance(operation, dict):
                    known[(method.upper(), path)] = frozenset(
                        p["name"] for p in operation.get("parameters", [])
                        if p.get("in") == "query")
        app.state.query_parameters = known
    return known
