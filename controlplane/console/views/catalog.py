"""Alias pages: the namespace's aliases, one alias's generation history, the config diff
between two of its generations, and what a rollback would restore.

History rows are the API's own `GenerationOut` (catalog/endpoints.py `generation_out`),
so the console and `adapterctl history` show the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import or_
from sqlalchemy.orm import Session

from controlplane.auth.scopes import Principal, Role
from controlplane.catalog.endpoints import generation_out
from controlplane.catalog.repository import AliasRepository, GenerationRepository
from controlplane.catalog.resolution import list_resolutions, read_alias
from controlplane.catalog.schemas import GenerationOut, ResolutionOut
from controlplane.console.views.adapter_config import ConfigUnavailable, read_adapter_config
from controlplane.console.views.config_diff import ConfigDiff, diff_configs
from controlplane.errors import InvalidState, NotFound
from controlplane.kit.pagination import PageParams
from controlplane.models import Alias, CatalogGeneration
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage import ObjectStore

ROLLBACK_CANDIDATES = 50
"""Earlier generations offered as rollback targets (any older one: `to_generation`)."""


@dataclass(frozen=True)
class AliasList:
    namespace: str
    items: list[ResolutionOut]
    next_cursor: str | None
    can_publish: bool


@dataclass(frozen=True)
class AliasHistory:
    namespace: str
    alias: str
    current: ResolutionOut
    history: list[GenerationOut]
    next_cursor: str | None
    can_publish: bool


@dataclass(frozen=True)
class GenerationDiff:
    before: GenerationOut
    after: GenerationOut
    diff: ConfigDiff | None
    """None when there is nothing to compare (see `note`)."""
    note: str | None


@dataclass(frozen=True)
class RollbackPlan:
    current_generation: int
    target: GenerationOut
    """The generation whose artifact the rollback restores."""
    candidates: list[GenerationOut]
    """Earlier generations with an artifact other than the current one, newest first."""


def alias_list(session: Session, principal: Principal, namespace: str,
               params: PageParams) -> AliasList:
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    page = list_resolutions(session.connection(), ns.id, namespace, params)
    return AliasList(namespace, page["items"], page["next_cursor"],
                     principal.can(namespace, Role.PUBLISH))


def published_alias(session: Session, namespace: str, alias: str) -> Alias:
    """The alias row; 404 NOT_FOUND when the namespace or a published alias is missing."""
    ns = NamespaceRepository(session).get_by_name(namespace)
    found = AliasRepository(session).by_name(ns.id, alias)
    if found is None or found.current_generation == 0:
        raise NotFound(f"alias {namespace}/{alias} not found",
                       detail={"namespace": namespace, "alias": alias})
    return found


def alias_history(session: Session, principal: Principal, namespace: str, alias: str,
                  params: PageParams) -> AliasHistory:
    principal.require(namespace, Role.READ)
    row = published_alias(session, namespace, alias)
    generations = GenerationRepository(session)
    page = generations.paginate(generations.history(row.id), key=CatalogGeneration.generation,
                                params=params, descending=True)
    current = read_alias(session.connection(), namespace, alias, row.id)
    return AliasHistory(namespace, alias, current, [generation_out(g) for g in page.items],
                        page.next_cursor, principal.can(namespace, Role.PUBLISH))


def _generation(session: Session, row: Alias, number: int) -> CatalogGeneration:
    found = GenerationRepository(session).get(row.id, number)
    if found is None:
        raise NotFound(f"alias {row.namespace.name}/{row.name} has no generation {number}",
                       detail={"namespace": row.namespace.name, "alias": row.name,
                               "generation": number})
    return found


def generation_diff(session: Session, store: ObjectStore, principal: Principal,
                    namespace: str, alias: str, before: int, after: int) -> GenerationDiff:
    """The adapter-config difference from generation `before` to generation `after`."""
    principal.require(namespace, Role.READ)
    row = published_alias(session, namespace, alias)
    old, new = _generation(session, row, before), _generation(session, row, after)
    old_out, new_out = generation_out(old), generation_out(new)
    if old.artifact is None or new.artifact is None:
        which = before if old.artifact is None else after
        kind = ("serves a merged release" if (old if which == before else new).merge_id
                else "is a retire")
        return GenerationDiff(old_out, new_out, None,
                              f"generation {which} {kind}: it names no adapter")
    if old.artifact_id == new.artifact_id:
        return GenerationDiff(old_out, new_out, None,
                              f"both generations name artifact {old.artifact_id}: "
                              "no difference")
    try:
        diff = diff_configs(read_adapter_config(store, old.artifact),
                            read_adapter_config(store, new.artifact))
    except ConfigUnavailable as exc:
        return GenerationDiff(old_out, new_out, None, f"config unavailable: {exc}")
    return GenerationDiff(old_out, new_out, diff, None)


def rollback_plan(session: Session, principal: Principal, namespace: str, alias: str,
                  to_generation: int | None) -> RollbackPlan:
    """What `rollback` with this `to_generation` (None: the service's default target)
    would restore; the same refusals as the service (404, 409 INVALID_STATE)."""
    principal.require(namespace, Role.PUBLISH)
    row = published_alias(session, namespace, alias)
    generations = GenerationRepository(session)
    current = _generation(session, row, row.current_generation)
    where = {"namespace": namespace, "alias": alias}
    earlier = session.scalars(
        generations.history(row.id)
        .where(CatalogGeneration.generation < row.current_generation,
               or_(CatalogGeneration.artifact_id.is_not(None),
                   CatalogGeneration.merge_id.is_not(None)))
        .order_by(CatalogGeneration.generation.desc()).limit(ROLLBACK_CANDIDATES)
    ).unique().all()
    candidates = [g for g in earlier if g.target != current.target]
    if to_generation is None:  # the service's default target
        default = generations.previous_target(row.id, row.current_generation, current.target)
        if default is None:
            raise InvalidState("nothing to roll back to", detail=where)
        target = default
    else:
        target = _generation(session, row, to_generation)
        if to_generation >= row.current_generation:
            raise NotFound(f"no earlier generation {to_generation}",
                           detail={**where, "to_generation": to_generation})
        if target.target == (None, None):
            raise InvalidState(f"generation {to_generation} is a retire",
                               detail={**where, "to_generation": to_generation})
    if all(g.generation != target.generation for g in candidates):
        candidates = [target, *candidates]  # an explicit target naming the current artifact
    return RollbackPlan(row.current_generation, generation_out(target),
                        [generation_out(g) for g in candidates])
