"""Mark an alias hot (or not): placement then keeps its current artifact resident on
every compatible agent (controlplane/placement/policy.py, rule 0), so a publication to
a hot alias is loaded fleet-wide before any request for it arrives.

The mark is not a generation: it survives publish, retire and rollback, and changing it
leaves the catalog version alone. It changes every agent's `prefetch` all the same, so
a change bumps the alias's namespace `policy_revision` (and so `tenants_version`, which
long-polling agents wait on with `tenants_after`) and NOTIFYs the catalog channel, like
a namespace policy change (controlplane/namespaces/service.py).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from controlplane.audit.service import record_audit
from controlplane.catalog.repository import AliasRepository
from controlplane.db import begin_write
from controlplane.errors import BadRequest, NotFound
from controlplane.models import Alias
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.namespaces.service import bump_policy_revision


def set_hot(session: Session, *, namespace: str, alias: str, hot: bool, actor: str) -> Alias:
    """Set `namespace/alias`'s hot mark. Audited (`alias.hot`, before and after) even when
    it already had the value; bumps the namespace's policy revision only on a change.
    Commits; a non-boolean `hot` (422) or an unknown namespace or alias (404) changes
    nothing."""
    if not isinstance(hot, bool):
        raise BadRequest("hot must be true or false", detail={"hot": str(hot)})
    begin_write(session)
    # the namespace row first, as `set_policy` does: its revision is what changes
    ns = NamespaceRepository(session).lock_by_name(namespace)
    row = AliasRepository(session).lock(ns.id, alias)
    if row is None or row.current_generation == 0:
        raise NotFound(f"alias {namespace}/{alias} was never published",
                       detail={"namespace": namespace, "alias": alias})
    before = row.hot
    row.hot = hot
    if hot != before:
        bump_policy_revision(session, ns)
    record_audit(session, actor=actor, action="alias.hot", namespace=namespace,
                 target=f"alias:{namespace}/{alias}", detail={"before": before, "after": hot})
    session.commit()
    return row
