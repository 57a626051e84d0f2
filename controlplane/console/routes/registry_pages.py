"""Artifacts (list, one in full) and collections of a namespace."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from controlplane.auth.scopes import Role
from controlplane.console.rendering import render
from controlplane.console.route import ConsoleRoute
from controlplane.console.session import CONSOLE_PREFIX, ConsolePrincipal
from controlplane.console.views.artifacts import STATES, artifact_detail, artifact_list
from controlplane.console.views.collections import collection_list
from controlplane.kit.deps import SessionDep
from controlplane.kit.pagination import PageParams

router = APIRouter(prefix=CONSOLE_PREFIX, route_class=ConsoleRoute, include_in_schema=False)
Cursor = Annotated[str | None, Query(max_length=200)]
PAGE = 50


@router.get("/namespaces/{namespace}/artifacts")
def artifacts_page(request: Request, namespace: str, principal: ConsolePrincipal,
                   session: SessionDep, cursor: Cursor = None,
                   state: Annotated[str | None, Query(max_length=20)] = None) -> Response:
    page = artifact_list(session, principal, namespace, state or None,
                         PageParams(PAGE, cursor or None))
    return render(request, "artifacts.html", {"namespace": namespace, "page": page,
                                              "states": STATES})


@router.get("/namespaces/{namespace}/artifacts/{ref}")
def artifact_page(request: Request, namespace: str, ref: str, principal: ConsolePrincipal,
                  session: SessionDep) -> Response:
    artifact = artifact_detail(session, principal, namespace, ref)
    return render(request, "artifact.html", {
        "namespace": namespace, "artifact": artifact,
        "can_publish": principal.can(namespace, Role.PUBLISH)})


@router.get("/namespaces/{namespace}/collections")
def collections_page(request: Request, namespace: str, principal: ConsolePrincipal,
                     session: SessionDep, cursor: Cursor = None) -> Response:
    page = collection_list(session, principal, namespace, PageParams(PAGE, cursor or None))
    return render(request, "collections.html", {"namespace": namespace, "page": page})
