"""Token issuance and lookup. Plaintext tokens are `ap_<43 urlsafe chars>`; only
their SHA-256 is stored, so a database leak does not leak usable credentials."""

from __future__ import annotations

import hashlib
import secrets

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


def authenticate(session: Session, plaintext: str) -> Principal:
    token = TokenRepository(session).by_hash(hash_token(plaintext))
    if token is None or token.revoked:
        raise Unauthenticated("unknown or revoked token")
    return principal_of(token)


def principal_of(token: ApiToken) -> Principal:
    grants = tuple(Grant(g["namespace"], Role(g["role"])) for g in token.grants)
    return Principal(token_id=token.id, name=token.name, grants=grants, is_agent=token.is_agent)
