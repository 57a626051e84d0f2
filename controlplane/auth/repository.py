"""Token queries."""

from __future__ import annotations

from sqlalchemy import select

from controlplane.kit.repository import Repository
from controlplane.models import ApiToken


class TokenRepository(Repository[ApiToken]):
    model = ApiToken
    noun = "token"

    def by_hash(self, token_sha256: str) -> ApiToken | None:
        return self.get_one_or_none(select(ApiToken).where(ApiToken.token_sha256 == token_sha256))
