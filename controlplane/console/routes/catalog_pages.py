"""Namespaces, aliases, alias history with the config diff, and the publish / rollback /
retire confirmation pages and their POSTs.

A change is two steps: the alias page links to a confirmation page that says what will
happen and carries the generation the user saw (`expected_generation`); its POST calls
the catalog service in-process (`apply_change`), with the same compare-and-swap as
`adapterctl`. A conflict re-renders the confirmation with the API's message and the
now-current generation, so the user confirms again knowingly; nothing was written.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.datastructures import FormData

from controlplane.auth.scopes import Principal, Role
from controlplane.catalog.schemas import (
    ALIAS_PATTERN,
    PublishRequest,
    RetireRequest,
    RollbackRequest,
)
from controlplane.catalog.service import CatalogRequest, apply_change
from controlplane.console.rendering import render
from controlplane.console.route import ConsoleRoute
from controlplane.console.routes.forms import checked_form, int_field, text_field
from controlplane.console.session import CONSOLE_PREFIX, ConsolePrincipal
from controlplane.console.views.artifacts import artifact_detail
from controlplane.console.views.catalog import (
    alias_history,
    alias_list,
    generation_diff,
    published_alias,
    rollback_plan,
)
from controlplane.console.views.namespaces import readable_namespaces
from controlplane.errors import AdapterplaneError, BadRequest, GenerationConflict, NotFound
from controlplane.kit.deps import SessionDep, StoreDep
from controlplane.kit.pagination import PageParams
from controlplane.models import CatalogAction
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage import ObjectStore

router = APIRouter(prefix=CONSOLE_PREFIX, route_class=ConsoleRoute, include_in_schema=False)

AliasName = Annotated[str, Path(pattern=ALIAS_PATTERN)]
ActionName = Literal["publish", "rollback", "retire"]
Cursor = Annotated[str | None, Query(max_length=200)]
Generation = Annotated[int | None, Query(ge=0, le=2**31 - 1)]
Compared = Annotated[int | None, Query(ge=1, le=2**31 - 1)]
PAGE = 50


def alias_path(namespace: str, alias: str) -> str:
    return f"{CONSOLE_PREFIX}/namespaces/{namespace}/aliases/{alias}"


@router.get("/namespaces")
def namespaces_page(request: Request, principal: ConsolePrincipal,
                    session: SessionDep) -> Response:
    return render(request, "namespaces.html",
                  {"namespaces": readable_namespaces(session, principal)})


@router.get("/namespaces/{namespace}/aliases")
def aliases_page(request: Request, namespace: str, principal: ConsolePrincipal,
                 session: SessionDep, cursor: Cursor = None) -> Response:
    page = alias_list(session, principal, namespace, PageParams(PAGE, cursor or None))
    return render(request, "aliases.html", {"namespace": namespace, "page": page})


@router.get("/namespaces/{namespace}/aliases/{alias}")
def alias_page(request: Request, namespace: str, alias: AliasName,
               principal: ConsolePrincipal, session: SessionDep, store: StoreDep,
               cursor: Cursor = None, diff_from: Compared = None,
               diff_to: Compared = None, changed: Compared = None) -> Response:
    """History (newest first) and the adapter-config diff of two generations (default:
    the one before the current and the current)."""
    history = alias_history(session, principal, namespace, alias,
                            PageParams(PAGE, cursor or None))
    current = history.current.generation
    before = diff_from if diff_from is not None else current - 1
    after = diff_to if diff_to is not None else current
    diff = None
    if before >= 1 and after >= 1:
        diff = generation_diff(session, store, principal, namespace, alias, before, after)
    return render(request, "alias.html", {
        "namespace": namespace, "alias": alias, "history": history, "diff": diff,
        "diff_from": before, "diff_to": after, "changed": changed})


@router.get("/namespaces/{namespace}/publish")
def publish_to(namespace: str, principal: ConsolePrincipal,
               alias: Annotated[str, Query(pattern=ALIAS_PATTERN)],
               artifact: Annotated[str, Query(min_length=1, max_length=200)]) -> Response:
    """The forms that name the alias in a field (a new alias, an artifact's page) land
    on that alias's publish confirmation."""
    principal.require(namespace, Role.PUBLISH)
    return RedirectResponse(f"{alias_path(namespace, alias)}/publish?"
                            f"{urlencode({'artifact': artifact})}", status_code=303)


def _confirmation(session: Session, principal: Principal, namespace: str, alias: str,
                  action: ActionName, *, artifact: str | None, to_generation: int | None,
                  expected_generation: int | None) -> dict[str, Any]:
    """What the confirmation page shows; raises what the change itself would refuse
    early (scope, unknown alias or artifact, nothing to roll back to)."""
    principal.require(namespace, Role.PUBLISH)
    NamespaceRepository(session).get_by_name(namespace)
    page: dict[str, Any] = {"namespace": namespace, "alias": alias, "action": action,
                            "artifact": None, "plan": None, "current": None}
    if action == "publish":
        if artifact is None:
            raise BadRequest("name the artifact to publish (an id or sha256:<H_artifact>)",
                             detail={"field": "artifact"})
        page["artifact"] = artifact_detail(session, principal, namespace, artifact)
        try:
            page["current"] = alias_history(session, principal, namespace, alias,
                                            PageParams(1, None)).current
        except NotFound:
            page["current"] = None  # a new alias: its first generation
    elif action == "rollback":
        page["plan"] = rollback_plan(session, principal, namespace, alias, to_generation)
        page["current"] = alias_history(session, principal, namespace, alias,
                                        PageParams(1, None)).current
    else:
        published_alias(session, namespace, alias)
        page["current"] = alias_history(session, principal, namespace, alias,
                                        PageParams(1, None)).current
    seen = page["current"].generation if page["current"] is not None else 0
    page["expected_generation"] = seen if expected_generation is None else expected_generation
    return page


@router.get("/namespaces/{namespace}/aliases/{alias}/{action}")
def confirm_page(request: Request, namespace: str, alias: AliasName, action: ActionName,
                 principal: ConsolePrincipal, session: SessionDep,
                 artifact: Annotated[str | None, Query(max_length=200)] = None,
                 to_generation: Generation = None,
                 expected_generation: Generation = None) -> Response:
    page = _confirmation(session, principal, namespace, alias, action,
                         artifact=artifact or None, to_generation=to_generation,
                         expected_generation=expected_generation)
    return render(request, "confirm.html", page)


def _request(namespace: str, alias: str, action: ActionName, principal: Principal,
             form: FormData) -> CatalogRequest:
    """The form as the API's own request body (same validation), then the service's."""
    expected, reason = int_field(form, "expected_generation"), text_field(form, "reason")
    artifact: str | None = None
    to_generation: int | None = None
    try:
        if action == "publish":
            artifact = PublishRequest(artifact=text_field(form, "artifact") or "",
                                      expected_generation=expected, reason=reason).artifact
        elif action == "rollback":
            to_generation = RollbackRequest(to_generation=int_field(form, "to_generation"),
                                            expected_generation=expected,
                                            reason=reason).to_generation
        else:
            RetireRequest(expected_generation=expected, reason=reason)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"invalid {where}: {first['msg']}", detail={"field": where}) from exc
    if action == "publish" and not artifact:
        raise BadRequest("name the artifact to publish", detail={"field": "artifact"})
    return CatalogRequest(namespace=namespace, alias=alias, action=CatalogAction(action),
                          actor=principal.actor, artifact_ref=artifact,
                          expected_generation=expected, to_generation=to_generation,
                          reason=reason)


def _apply(session: Session, store: ObjectStore, req: CatalogRequest) -> int:
    gen, _created = apply_change(session, req, store)
    return gen.generation


@router.post("/namespaces/{namespace}/aliases/{alias}/{action}")
async def change(request: Request, namespace: str, alias: AliasName, action: ActionName,
                 principal: ConsolePrincipal, session: SessionDep,
                 store: StoreDep) -> Response:
    form = await checked_form(request)
    principal.require(namespace, Role.PUBLISH)
    req = _request(namespace, alias, action, principal, form)
    try:
        number = await run_in_threadpool(_apply, session, store, req)
    except GenerationConflict as exc:
        session.rollback()
        page = await run_in_threadpool(
            _confirmation, session, principal, namespace, alias, action,
            artifact=req.artifact_ref, to_generation=req.to_generation,
            expected_generation=None)
        return render(request, "confirm.html", {**page, "conflict": exc,
                                                "reason": req.reason},
                      status_code=exc.status_code)
    except AdapterplaneError:
        session.rollback()
        raise
    return RedirectResponse(f"{alias_path(namespace, alias)}?changed={number}",
                            status_code=303)
