"""Token issuance and lookup. Plaintext tokens are `ap_<43 urlsafe chars>`; only
their SHA-256 is stored, so a database leak does not leak usable credentials."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, bindparam, select
from sqlalchemy.orm import Session

from controlplane.audit.service import record_audit
from controlplane.auth.repository import TokenRepository
from controlplane.auth.scopes import ALL_NAMESPACES, Grant, Principal, Role
from controlplane.db import begin_write
from controlplane.errors import NotFound, Unauthenticated
from controlplane.models import ApiToken

TOKEN_PREFIX = "ap_"


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def new_token_plaintext() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def issue_token(
    session: Session, *, name: str, grants: list[Grant], is_agent: bool, actor: str
) -> tuple[ApiToken, str]:
    """Create a token in the current transaction (with its audit row); caller commits."""
    plaintext = new_token_plaintext()
    token = ApiToken(
        name=name,
        token_sha256=hash_token(plaintext),
        grants=[{"namespace": g.namespace, "role": g.role.value} for g in grants],
        is_agent=is_agent,
    )
    TokenRepository(session).add(token)
    record_audit(session, actor=actor, action="token.create", target=f"token:{token.id}",
                 detail={"name": name, "grants": token.grants, "is_agent": is_agent})
    return token, plaintext


def create_bootstrap_token(session: Session, name: str) -> str:
    """Create an admin token with grant `{*, admin}`, commit, return its plaintext once.

    Used by `adapterplane bootstrap-token`, which talks to the database directly.
    """
    begin_write(session)
    _token, plaintext = issue_token(
        session, name=name, grants=[Grant(ALL_NAMESPACES, Role.ADMIN)], is_agent=False,
        actor="bootstrap",
    )
    session.commit()
    return plaintext


def revoke_token(session: Session, token_id: int, *, actor: str) -> ApiToken:
    begin_write(session)
    token = TokenRepository(session).get_by_id(token_id)
    if token is None:
        raise NotFound(f"token {token_id} not found", detail={"kind": "token", "ref": token_id})
    if not token.revoked:
        token.revoked = True
        record_audit(session, actor=actor, action="token.revoke", target=f"token:{token.id}")
    session.commit()
    return token


_tokens = ApiToken.__table__
PRINCIPAL_COLUMNS = (_tokens.c.id.label("token_id"), _tokens.c.name.label("token_name"),
                     _tokens.c.grants, _tokens.c.is_agent)
"""What a Principal is built from; other hot queries select these too (resolve)."""


def token_matches(token_sha256: Any) -> ColumnElement[bool]:
    """WHERE clause: the token with this hash, unless it is revoked."""
    return and_(_tokens.c.token_sha256 == token_sha256, _tokens.c.revoked.is_(False))


AUTHENTICATE = select(*PRINCIPAL_COLUMNS).where(token_matches(bindparam("token_sha256")))


def authenticate(conn: Connection, plaintext: str) -> Principal:
    """One indexed SELECT (unique `token_sha256`) of the columns a Principal needs.

    No cache: a revoked token fails from the next statement after the revoking
    transaction commits, in every server process."""
    row = conn.execute(AUTHENTICATE, {"token_sha256": hash_token(plaintext)}).first()
    if row is None:
        raise Unauthenticated("unknown or revoked token")
    return principal_from_row(row)


def principal_from_row(row: Any) -> Principal:
    """A Principal from a row holding `PRINCIPAL_COLUMNS`."""
    grants = tuple(Grant(g["namespace"], Role(g["role"])) for g in row.grants)
    return Principal(token_id=row.token_id, name=row.token_name, grants=grants,
                     is_agent=row.is_agent)
